"""The data builder: determinism, sizes, split, ranking semantics, and readability by the pipeline's readers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_lib.config import DataConfig
from rlhf_lib.data import (
    file_fingerprint,
    read_pairs,
    read_prompts,
    read_ranked,
    read_sft,
)
from rlhf_lib.demo_task import (
    ADVERSARIAL_KINDS,
    EVAL_PAIR_MARGIN,
    TEST_TOPICS,
    TOPIC_NAMES,
    VAL_TOPICS,
    build_demo_task,
    gold_breakdown,
    gold_score,
    prompt_slots,
    split_combos,
    summarize,
    train_combos,
)
from rlhf_lib.demo_task import judge
from rlhf_lib.demo_task.adversarial import ADVERSARIAL_MARGIN
from rlhf_lib.demo_task.builder import loop_twin
from rlhf_lib.demo_task.responses import HELDOUT_OPENERS
from rlhf_lib.demo_task.slots import HELDOUT_FACT_TEMPLATES, words

SMALL = dict(n_train_prompts=40, n_eval_prompts=12, sft_per_prompt=2, ranked_per_prompt=2, responses_per_list=4,
             eval_pairs_per_prompt=2, adversarial_per_topic_pair=1, adversarial_per_kind=6)
KEYS = {"sft", "preferences", "prompts_train", "prompts_eval", "eval_pairs", "prompts_val", "adversarial_pairs"}


def build(tmp: Path, name: str, **overrides: object) -> dict[str, Path]:
    return build_demo_task(DataConfig(**{**SMALL, **overrides}), tmp / name)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("demo"), "a")


def test_same_seed_same_bytes(tmp_path: Path, built: dict[str, Path]) -> None:
    again = build(tmp_path, "b")
    assert set(again) == KEYS
    for key in KEYS:
        assert again[key].read_bytes() == built[key].read_bytes(), key


def test_different_seed_different_data(tmp_path: Path, built: dict[str, Path]) -> None:
    other = build(tmp_path, "c", seed=1)
    for key in KEYS:
        assert other[key].read_bytes() != built[key].read_bytes(), key


def test_independent_of_hash_seed(tmp_path: Path, built: dict[str, Path]) -> None:
    """Nothing depends on set/dict hashing: a fresh interpreter with another PYTHONHASHSEED writes the same bytes."""
    code = (
        "import sys, json; from rlhf_lib.config import DataConfig; from rlhf_lib.demo_task import build_demo_task; "
        "from rlhf_lib.data import file_fingerprint; "
        f"p = build_demo_task(DataConfig(**{SMALL!r}), sys.argv[1]); "
        "print(json.dumps({k: file_fingerprint(v) for k, v in p.items()}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "h")], env=env, cwd=root, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) == {k: file_fingerprint(v) for k, v in built.items()}


def test_sizes(built: dict[str, Path]) -> None:
    n, e = SMALL["n_train_prompts"], SMALL["n_eval_prompts"]
    assert len(lines(built["prompts_train"])) == n
    assert len(lines(built["prompts_eval"])) == e
    assert len(lines(built["sft"])) == n * SMALL["sft_per_prompt"]
    assert len(lines(built["preferences"])) == n * SMALL["ranked_per_prompt"]
    assert len(lines(built["eval_pairs"])) == e * SMALL["eval_pairs_per_prompt"]


def test_split_respected(built: dict[str, Path]) -> None:
    train, test, val = train_combos(), split_combos("test"), split_combos("validation")
    for key in ("prompts_train", "sft", "preferences"):
        for row in lines(built[key]):
            slots = prompt_slots(row["prompt"])
            assert slots is not None and slots[:2] in train
    for key, combos in (("prompts_eval", test), ("eval_pairs", test), ("adversarial_pairs", test),
                        ("prompts_val", val)):
        for row in lines(built[key]):
            slots = prompt_slots(row["prompt"])
            assert slots is not None and slots[:2] in combos, key


def test_training_files_never_show_what_is_held_out(built: dict[str, Path]) -> None:
    """No held-out topic keyword (not even off-topic), fact template or opener in any text training reads."""
    held_words = set(TEST_TOPICS + VAL_TOPICS)
    held_phrases = [*HELDOUT_OPENERS, *(t.split("{k}")[0].strip() for t in HELDOUT_FACT_TEMPLATES)]
    texts = [r["prompt"] for r in lines(built["prompts_train"])]
    texts += [t for r in lines(built["sft"]) for t in (r["prompt"], r["response"])]
    texts += [t for r in lines(built["preferences"]) for t in (r["prompt"], *r["responses"])]
    for text in texts:
        assert not set(words(text)) & held_words, text
        assert not any(p in text for p in held_phrases), text
    # ... while the held-out pairs use them: the test split is not the training distribution.
    held = " ".join(t for r in lines(built["eval_pairs"]) + lines(built["adversarial_pairs"])
                    for t in (r["chosen"], r["rejected"]))
    assert all(p in held for p in held_phrases) and set(words(held)) & set(TEST_TOPICS)


def test_validation_swaps_the_reported_split_and_keeps_training(tmp_path: Path, built: dict[str, Path]) -> None:
    val = build(tmp_path, "val", heldout="validation")
    for key in ("sft", "preferences", "prompts_train", "prompts_val"):
        assert val[key].read_bytes() == built[key].read_bytes(), key
    assert {r["prompt"] for r in lines(val["prompts_eval"])} <= {r["prompt"] for r in lines(built["prompts_val"])}
    for row in lines(val["eval_pairs"]) + lines(val["adversarial_pairs"]):
        assert prompt_slots(row["prompt"])[:2] in split_combos("validation")


def test_adversarial_pairs(built: dict[str, Path]) -> None:
    rows = lines(built["adversarial_pairs"])
    topics = sorted({prompt_slots(r["prompt"])[0] for r in lines(built["prompts_eval"])})
    kinds = [r["category"].split(":")[0] for r in rows]
    assert kinds.count("topic") == len(topics) * (len(TOPIC_NAMES) - 1)  # per_topic_pair = 1: every topic pair once
    assert all(kinds.count(k) == 6 for k in ADVERSARIAL_KINDS[1:])
    for r in rows:
        gap = gold_score(r["prompt"], r["chosen"]) - gold_score(r["prompt"], r["rejected"])
        assert gap >= ADVERSARIAL_MARGIN, r
        own = prompt_slots(r["prompt"])[0]
        kind, _, pair = r["category"].partition(":")
        if kind == "topic":  # the same words but for the keyword
            mine, other = pair.split(">")
            assert mine == own and other != own and r["rejected"] == r["chosen"].replace(own, other)
        elif kind == "loop":
            assert loop_twin(r["rejected"]) == r["chosen"]
        elif kind == "cut":
            assert r["rejected"].rstrip()[-1] not in ".!?" and gold_breakdown(r["prompt"], r["rejected"])["ending"] < 0
        elif kind in ("politeness", "facts"):  # more words saying nothing the judge counts again
            assert r["chosen"].strip() in r["rejected"] or kind == "facts"
            assert len(r["rejected"].split()) > len(r["chosen"].split())
            gc, gr = gold_breakdown(r["prompt"], r["chosen"]), gold_breakdown(r["prompt"], r["rejected"])
            assert gc["tone"] == gr["tone"] and gc["detail"] == gr["detail"] and gr["length"] < gc["length"]


def test_prompts_cover_pool_before_repeating(tmp_path: Path) -> None:
    prompts = [r["prompt"] for r in lines(build(tmp_path, "d", n_eval_prompts=40)["prompts_eval"])]
    assert len(set(prompts)) == 40  # fewer than the 76 distinct held-out prompts: no repeats yet


def test_rankings_are_permutations_of_distinct_responses(built: dict[str, Path]) -> None:
    for row in lines(built["preferences"]):
        k = SMALL["responses_per_list"]
        assert len(row["responses"]) == len(set(row["responses"])) == k
        assert sorted(row["ranking"]) == list(range(k))
        assert all(r.startswith(" ") and not r.startswith("  ") for r in row["responses"])


def test_zero_noise_ranks_in_gold_order(tmp_path: Path) -> None:
    for row in lines(build(tmp_path, "e", rank_noise=0.0)["preferences"]):
        scores = [gold_score(row["prompt"], row["responses"][i]) for i in row["ranking"]]
        assert scores == sorted(scores, reverse=True)


def test_noise_makes_labels_imperfect(tmp_path: Path) -> None:
    stats = summarize(build(tmp_path, "f", rank_noise=2.0))
    assert 0.5 < stats["label_agreement"] < 1.0
    assert summarize(build(tmp_path, "g", rank_noise=0.0))["label_agreement"] == 1.0


def test_eval_pairs_have_margin(built: dict[str, Path]) -> None:
    for row in lines(built["eval_pairs"]):
        assert row["chosen"] != row["rejected"]
        assert gold_score(row["prompt"], row["chosen"]) - gold_score(row["prompt"], row["rejected"]) >= EVAL_PAIR_MARGIN


def test_files_pass_the_readers(built: dict[str, Path]) -> None:
    assert not read_sft(built["sft"]).skipped
    assert not read_ranked(built["preferences"]).skipped
    assert not read_prompts(built["prompts_train"]).skipped
    assert not read_prompts(built["prompts_eval"]).skipped
    assert not read_pairs(built["eval_pairs"]).skipped
    assert not read_prompts(built["prompts_val"]).skipped
    assert {p.category for p in read_pairs(built["adversarial_pairs"]).rows} >= {"loop", "cut", "politeness", "facts"}


def test_sft_is_mediocre_and_ranked_lists_span_the_range(built: dict[str, Path]) -> None:
    stats = summarize(built)
    assert stats["ranked_worst_mean_gold"] < stats["sft_mean_gold"] < stats["ranked_best_mean_gold"]
    assert stats["sft_mean_gold"] < 1.5  # well below the best achievable ~3.15: headroom for RLHF
    assert stats["eval_chosen_mean_gold"] > stats["eval_rejected_mean_gold"]


def test_row_formats(built: dict[str, Path]) -> None:
    assert set(lines(built["sft"])[0]) == {"prompt", "response"}
    assert set(lines(built["preferences"])[0]) == {"prompt", "responses", "ranking"}
    assert set(lines(built["prompts_eval"])[0]) == {"prompt"}
    assert set(lines(built["eval_pairs"])[0]) == {"prompt", "chosen", "rejected"}




def test_topic_twins_are_minimal_pairs(tmp_path: Path) -> None:
    # topic_twins=2, K=4: responses (0, 1) and (2, 3) are the same text but for the topic keyword, one on the
    # prompt's topic and one off it, so they differ in the judge's topic term (+0.75 vs -0.75) and in the detail of
    # on-topic facts, in nothing else.
    for row in lines(build(tmp_path, "t", topic_twins=2)["preferences"]):
        r = row["responses"]
        assert len(set(r)) == 4 and sorted(row["ranking"]) == [0, 1, 2, 3]
        for a, b in ((0, 1), (2, 3)):
            wa, wb = words(r[a]), words(r[b])
            assert len(wa) == len(wb) and len({(x, y) for x, y in zip(wa, wb) if x != y}) == 1  # one keyword swapped
            ga, gb = gold_breakdown(row["prompt"], r[a]), gold_breakdown(row["prompt"], r[b])
            assert {ga["topic"], gb["topic"]} == {0.75, -0.75}
            assert {k for k in ga if ga[k] != gb[k]} <= {"topic", "detail"}


def test_topic_twins_are_ranked_like_the_others(tmp_path: Path) -> None:
    # Noise-free, the on-topic twin always ranks above its off-topic twin; with noise the labels stay mostly right.
    for row in lines(build(tmp_path, "u", topic_twins=1, rank_noise=0.0)["preferences"]):
        on = 0 if gold_breakdown(row["prompt"], row["responses"][0])["topic"] > 0 else 1
        assert row["ranking"].index(on) < row["ranking"].index(1 - on)
    assert 0.8 < summarize(build(tmp_path, "v", topic_twins=2))["label_agreement"] < 1.0


def test_loop_twins_differ_only_in_the_loop(tmp_path: Path) -> None:
    # topic_twins=2, loop_twins=1, K=6: responses (4, 5) are a response with a word said three times in a row and the
    # same response with it said once; the judge's repetition term is all that tells them apart (and the loop's
    # words of length, inside the ideal window or past it).
    for row in lines(build(tmp_path, "l", responses_per_list=6, topic_twins=2, loop_twins=1)["preferences"]):
        r = row["responses"]
        assert len(set(r)) == 6
        looped, once = words(r[4]), words(r[5])
        extra = len(looped) - len(once)  # 2, or 1 where a cut ending kept two of the three copies
        assert extra in (1, 2) and loop_twin(r[4]) == r[5]
        ga, gb = gold_breakdown(row["prompt"], r[4]), gold_breakdown(row["prompt"], r[5])
        # At least the loop's penalty (more where the looped word also ends the sentence before: "like it. It It It").
        assert ga["repetition"] <= -extra * judge.W_LOOPED_WORD and gb["repetition"] == 0.0
        assert {k for k in ga if ga[k] != gb[k]} <= {"repetition", "length"}


def test_loop_twin_reads_each_loop_once() -> None:
    assert loop_twin(" Join a a a local club. It It depends. Okay.") == " Join a local club. It depends. Okay."
    assert loop_twin(" Many people like it. It depends.") == " Many people like it. It depends."  # no loop


def test_twins_must_fit_the_list() -> None:
    with pytest.raises(ValueError, match="topic_twins"):
        DataConfig(responses_per_list=3, topic_twins=2)
    with pytest.raises(ValueError, match="loop_twins"):
        DataConfig(responses_per_list=4, topic_twins=1, loop_twins=2)
