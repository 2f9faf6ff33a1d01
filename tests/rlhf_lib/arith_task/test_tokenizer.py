"""The arithmetic task's tokenizer (`train_tokenizer(..., split_digits=True)`): one token per digit; the default
tokenizer still merges digits as before."""

from __future__ import annotations

from pathlib import Path

from rlhf_lib.arith_task import build_arithmetic_task
from rlhf_lib.config import DataConfig
from rlhf_lib.models import train_tokenizer
from stages.sft import tokenizer_corpus


def test_split_digits_gives_one_token_per_digit_and_round_trips(tmp_path: Path) -> None:
    build_arithmetic_task(DataConfig(task="arithmetic", n_train_prompts=200, n_eval_prompts=20), tmp_path)
    corpus = list(tokenizer_corpus(tmp_path))
    split, plain = train_tokenizer(corpus, 512, split_digits=True), train_tokenizer(corpus, 512)
    text = "\n\nHuman: What is 37 + 48?\n\nAssistant: 85."
    pieces = [split.decode([i]) for i in split(text)["input_ids"]]
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["3", "7", "4", "8", "8", "5"]
    assert split.decode(split(text)["input_ids"]) == text
    assert split.decode(split(" 107.")["input_ids"]) == " 107."
    # Without the option BPE merges frequent numbers (with their leading space) into single tokens.
    assert any(len(t.lstrip("Ġ")) > 1 and t.lstrip("Ġ").isdigit() for t in plain.get_vocab())
    assert not any(len(t.lstrip("Ġ")) > 1 and t.lstrip("Ġ").isdigit() for t in split.get_vocab())
