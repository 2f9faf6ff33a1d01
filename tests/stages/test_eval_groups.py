"""The demo task's eval gold figures (its `gold_groups`) split by whether the prompt's topic was ever trained on (hand-made values)."""

from __future__ import annotations

import pytest

from rlhf_lib.demo_task import make_prompt
from rlhf_lib.demo_task.task import TASK

by_topic_group = TASK.gold_groups


def test_gold_by_topic_group() -> None:
    prompts = [make_prompt("hiking", 0), make_prompt("fishing", 1), make_prompt("chess", 2), make_prompt("yoga", 3)]
    metrics, bounds = by_topic_group(prompts, [1.0, -1.0, 2.0, 3.0], [0.0, -1.0, 2.5, 1.0])
    assert metrics == pytest.approx({
        "gold_reward_mean_new_topics": 0.0, "gold_reward_mean_sft_new_topics": -0.5,
        "win_rate_vs_sft_new_topics": 0.75,  # a win and a tie
        "gold_reward_mean_seen_topics": 2.5, "gold_reward_mean_sft_seen_topics": 1.75,
        "win_rate_vs_sft_seen_topics": 0.5})
    assert set(bounds) == set(metrics)
    lo, hi = bounds["gold_reward_mean_seen_topics"]
    assert 2.0 <= lo <= 2.5 <= hi <= 3.0


def test_a_group_without_prompts_is_left_out() -> None:
    metrics, _ = by_topic_group([make_prompt("chess", 0)], [1.0], [0.0])
    assert set(metrics) == {"gold_reward_mean_seen_topics", "gold_reward_mean_sft_seen_topics",
                            "win_rate_vs_sft_seen_topics"}
