"""Reward sources of PPO besides the trained reward model: Python functions and HTTP endpoints over decoded text,
their weighted sum with the RM's score, and the built-in functions (`rlhf_lib.rewards.builtin`)."""

from .base import RewardError, TextBatch, TextReward, check_scores

__all__ = ["RewardError", "TextBatch", "TextReward", "check_scores"]
