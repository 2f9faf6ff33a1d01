"""The eval's figures by group (eval.group_by): hand-computed means and leads per group, a prompt's repeated rows one
cluster, bounded group names, and a clear error for a prompt without the column."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.eval_groups import MAX_GROUPS, by_group, group_name, group_values
from rlhf_lib.eval_sampling import Generations


def _gens(scores):
    n = len(scores)
    return Generations([""] * n, torch.tensor(scores), torch.ones(n), torch.ones(n, dtype=torch.bool), torch.zeros(n))


def test_each_groups_means_and_paired_leads_by_hand():
    prompts = ["a", "b", "c", "d"]
    groups = [1, 1, 3, 3]
    pol, sft, ctl = _gens([1.0, 0.0, 1.0, 1.0]), _gens([0.0, 0.0, 0.0, 1.0]), _gens([1.0, 1.0, 0.0, 0.0])
    m, b = by_group("calls", groups, prompts, pol, sft, {"zero_reward": ctl})
    assert m["by_calls_1/reward_mean"] == 0.5 and m["by_calls_1/reward_mean_sft"] == 0.0
    assert m["by_calls_1/reward_lead_over_sft"] == 0.5 and m["by_calls_1/reward_lead_over_zero_reward"] == -0.5
    assert m["by_calls_3/reward_mean"] == 1.0 and m["by_calls_3/reward_lead_over_sft"] == 0.5
    assert m["by_calls_3/zero_reward_reward_mean"] == 0.0 and m["by_calls_3/reward_lead_over_zero_reward"] == 1.0
    assert b["by_calls_3/reward_mean"] == (1.0, 1.0)  # constant values: a point interval
    assert set(m) == set(b) and len(m) == 10


def test_a_prompts_repeated_rows_are_one_cluster():
    # Two prompts asked 4 times each: a cluster bootstrap draws 2 clusters, so the interval spans both means.
    prompts = ["a"] * 4 + ["b"] * 4
    pol, sft = _gens([1.0] * 4 + [0.0] * 4), _gens([0.0] * 8)
    _, b = by_group("calls", [2] * 8, prompts, pol, sft, {})
    assert b["by_calls_2/reward_mean"] == pytest.approx((0.0, 1.0))


def test_group_names_are_bounded_and_safe():
    assert group_name("a b/c") == "a_b_c" and len(group_name("x" * 99)) == 40 and group_name("") == "_"
    prompts = [str(i) for i in range(40)]
    m, _ = by_group("id", prompts, prompts, _gens([0.0] * 40), _gens([0.0] * 40), {})
    assert len({k.split("/")[0] for k in m}) == MAX_GROUPS


def test_a_prompt_without_the_column_is_named():
    with pytest.raises(ValueError, match=r"eval prompt 2 of eval.jsonl has no 'calls' field"):
        group_values("calls", ["p", "q"], {"p": {"calls": 1}, "q": {"answer": "3"}}, "eval.jsonl")
    assert group_values("calls", ["p"], {"p": {"calls": 1}}, "eval.jsonl") == [1]
