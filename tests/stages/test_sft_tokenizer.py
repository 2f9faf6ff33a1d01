"""The SFT stage's tokenizer is fitted on training texts only: no held-out prompt or pair is in its corpus."""

from __future__ import annotations

from pathlib import Path

from rlhf_lib.config import DataConfig
from rlhf_lib.data import read_pairs, read_prompts, read_ranked, read_sft
from rlhf_lib.demo_task import FILE_NAMES, build_demo_task
from stages.sft import tokenizer_corpus


def test_the_corpus_holds_every_training_text_and_no_held_out_text(tmp_path: Path) -> None:
    build_demo_task(DataConfig(n_train_prompts=40, n_eval_prompts=12), tmp_path)
    corpus = list(tokenizer_corpus(tmp_path))
    sft = read_sft(tmp_path / FILE_NAMES["sft"]).rows
    ranked = read_ranked(tmp_path / FILE_NAMES["preferences"]).rows
    assert corpus == [e.prompt + e.response for e in sft] + [e.prompt + r for e in ranked for r in e.responses]
    held_out = {p.prompt for p in read_prompts(tmp_path / FILE_NAMES["prompts_eval"]).rows}
    held_out |= {p.prompt for p in read_pairs(tmp_path / FILE_NAMES["eval_pairs"]).rows}
    assert held_out and not any(text.startswith(p) for text in corpus for p in held_out)
