"""Reward functions the tests name as `tests.rlhf_lib.rewards.sample_rewards:<name>`, as a user's module would be."""

from __future__ import annotations

import math

CALLS: list[dict] = []


def count_letters(prompts, completions, **kwargs):
    """Characters of each completion, and a record of what the call received."""
    CALLS.append({"prompts": list(prompts), "completions": list(completions), **kwargs})
    return [float(len(c)) for c in completions]


def constant(prompts, completions, value=1.0, **_):
    return [value] * len(completions)


def too_few(prompts, completions, **_):
    return [0.0] * (len(completions) - 1)


def not_finite(prompts, completions, **_):
    return [math.nan] + [0.0] * (len(completions) - 1)


def raises(prompts, completions, **_):
    raise KeyError("answer")


NOT_CALLABLE = 3


def slow(prompts, completions, seconds=0.05, **_):
    """0 per row, after sleeping `seconds`: a source whose cost shows in `time/score/<name>_s`."""
    import time

    time.sleep(seconds)
    return [0.0] * len(completions)
