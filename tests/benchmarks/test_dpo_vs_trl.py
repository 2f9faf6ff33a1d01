"""benchmarks/dpo_vs_trl.py's pure helpers (not the TRL venv): the cases, the rows TRL's collator takes, the verdict."""

from __future__ import annotations

import pytest

from benchmarks.dpo_vs_trl import cases, differences, table, trl_rows

STATS = {"loss": 0.7, "rewards/chosen": 0.1, "rewards/rejected": -0.1, "rewards/margins": 0.2,
         "rewards/accuracies": 1.0, "logps/chosen": -5.0, "logps/rejected": -7.0}


def test_three_losses_at_each_beta():
    got = cases((0.1, 0.5))
    assert [(c["loss_type"], c["label_smoothing"], c["beta"]) for c in got] == [
        ("sigmoid", 0.0, 0.1), ("sigmoid", 0.1, 0.1), ("ipo", 0.0, 0.1),
        ("sigmoid", 0.0, 0.5), ("sigmoid", 0.1, 0.5), ("ipo", 0.0, 0.5)]
    assert len({c["name"] for c in got}) == 6


def test_rows_split_at_the_prompt_and_keep_the_eos():
    # prompt [7, 8]; chosen reply [3] + EOS 0, rejected [4, 5] + EOS 0
    assert trl_rows([(([7, 8, 3, 0], 2), ([7, 8, 4, 5, 0], 2))]) == [
        {"prompt_ids": [7, 8], "chosen_ids": [3, 0], "rejected_ids": [4, 5, 0]}]
    with pytest.raises(ValueError, match="prompt"):
        trl_rows([(([7, 8, 3], 2), ([7, 9, 4], 2))])


def test_the_verdict_needs_every_difference_within_tolerance_and_the_same_tokens():
    assert differences(STATS, {**STATS, "loss": 0.75})["loss"] == pytest.approx(0.05)
    text, passed = table(["a"], {"a": STATS}, {"a": {**STATS, "rewards/margins": 0.2 + 5e-7}}, True)
    assert passed and text.splitlines()[0].startswith("PASS") and "| a | 0.7000000 | 0.7000000 |" in text
    assert not table(["a"], {"a": STATS}, {"a": {**STATS, "logps/rejected": -7.00001}}, True)[1]
    assert not table(["a"], {"a": STATS}, {"a": STATS}, tokens_identical=False)[1]
