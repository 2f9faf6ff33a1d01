"""The eval's figures group by group (`eval.group_by`): the prompts split by one of their columns (the chained
arithmetic task's `calls`), and per group the reward of the policy, of SFT and of each control arm, and the policy's
paired leads over them, each with a cluster interval over prompts."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from rlhf_lib.eval_sampling import Generations
from rlhf_lib.intervals import mean_interval

MAX_GROUPS = 32  # a column with more values splits into its most frequent 32 (figures are per group, bounded)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def group_name(value: object) -> str:
    """A group's value as it appears in a metric name: characters MLflow accepts, at most 40 of them."""
    return _UNSAFE.sub("_", str(value))[:40] or "_"


def by_group(column: str, groups: Sequence[object], prompts: Sequence[str], policy: Generations, sft: Generations,
             arms: Mapping[str, Generations]) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """`by_<column>_<value>/<figure>` for each group: reward_mean, reward_mean_sft, reward_lead_over_sft, and per
    control `<control>_reward_mean` and `reward_lead_over_<control>`; gold figures likewise where there is a judge.
    Means, and intervals from a bootstrap that resamples a prompt's rows together. Shapes: `groups`, `prompts` and
    each Generations hold N rows."""
    if len(groups) != len(prompts):
        raise ValueError(f"eval.group_by {column!r}: {len(groups)} group values for {len(prompts)} prompts")
    metrics: dict[str, float] = {}
    bounds: dict[str, tuple[float, float]] = {}
    for value, _ in Counter(group_name(g) for g in groups).most_common(MAX_GROUPS):
        idx = [i for i, g in enumerate(groups) if group_name(g) == value]
        pick = lambda values: [float(values[i]) for i in idx]  # noqa: E731
        rows = {"reward_mean": pick(policy.scores), "reward_mean_sft": pick(sft.scores),
                "reward_lead_over_sft": pick(policy.scores - sft.scores)}
        if policy.gold is not None and sft.gold is not None:
            rows |= {"gold_reward_mean": pick(policy.gold), "gold_reward_mean_sft": pick(sft.gold),
                     "gold_lead_over_sft": [policy.gold[i] - sft.gold[i] for i in idx]}
        for name, arm in arms.items():
            rows |= {f"{name}_reward_mean": pick(arm.scores), f"reward_lead_over_{name}": pick(policy.scores - arm.scores)}
            if policy.gold is not None and arm.gold is not None:
                rows[f"gold_lead_over_{name}"] = [policy.gold[i] - arm.gold[i] for i in idx]
        clusters = [prompts[i] for i in idx]
        for figure, values in rows.items():
            key = f"by_{column}_{value}/{figure}"
            metrics[key] = sum(values) / len(values)
            bounds[key] = mean_interval(values, groups=clusters)
    return metrics, bounds


def group_values(column: str, prompts: Sequence[str], columns: Mapping[str, Mapping[str, object]],
                 source: str) -> list[object]:
    """Each prompt's value of `column` (`eval.group_by`), read from the prompts' extra fields; a ValueError naming
    `source` (the eval prompts' file), the column and the first prompt without it."""
    out = []
    for i, prompt in enumerate(prompts):
        value = columns.get(prompt, {}).get(column)
        if value is None:
            raise ValueError(f"eval.group_by {column!r}: eval prompt {i + 1} of {source} has no {column!r} field "
                             f"({prompt[-60:]!r})")
        out.append(value)
    return out
