"""Held-out comparison: the gold win rate needs a judge; the RM-judged win rate is always there."""

from __future__ import annotations

import torch

from rlhf_lib.eval import Generations, compare, win_rate


def gens(scores, gold=None) -> Generations:
    n = len(scores)
    return Generations(["x"] * n, torch.tensor(scores), torch.full((n,), 4.0), torch.ones(n, dtype=torch.bool),
                       torch.zeros(n), gold)


def test_win_rate_counts_ties_half():
    # wins, tie, loss, win -> (1 + 0.5 + 0 + 1) / 4
    assert win_rate(torch.tensor([2.0, 1.0, 0.0, 3.0]), torch.tensor([1.0, 1.0, 1.0, 2.0])) == 0.625


def test_without_a_judge_only_the_rm_judges():
    m = compare(gens([2.0, 0.0, 1.0]), gens([1.0, 1.0, 1.0]))
    assert m["rm_win_rate_vs_sft"] == 0.5  # (1 + 0 + 0.5) / 3
    assert m["win_rate_vs_sft"] is None and m["gold_reward_mean"] is None and m["gold_reward_mean_sft"] is None
    assert m["reward_mean"] == 1.0 and m["reward_mean_sft"] == 1.0


def test_with_a_judge_both_are_reported():
    m = compare(gens([2.0, 0.0], gold=[0.5, 0.5]), gens([1.0, 1.0], gold=[0.0, 1.0]))
    assert m["win_rate_vs_sft"] == 0.5 and m["rm_win_rate_vs_sft"] == 0.5 and m["gold_reward_mean"] == 0.5
