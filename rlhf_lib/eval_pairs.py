"""Policies against each other on the same eval prompts, prompt by prompt: paired leads and win rates of any two
sampled policies (PPO, its control arms, DPO, best-of-n of SFT). The means of these rows are the eval's figures; a
bootstrap over prompts gives their intervals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from rlhf_lib.intervals import win_indicators


class Scored(Protocol):
    """What a comparison reads of a policy's replies: the reward sources' sum, shape (N,), and the judge's gold
    scores (N values, or None without a judge). `eval_sampling.Generations` is one."""

    scores: torch.Tensor
    gold: Sequence[float] | None


@dataclass(frozen=True)
class Picked:
    """Replies picked from several draws (best-of-n's kept reply per prompt): their scores (N,) and gold (N or None)."""

    scores: torch.Tensor
    gold: Sequence[float] | None


def head_to_head(a: Scored, b: Scored, prefix: str, name: str, upto: int | None = None
                 ) -> dict[str, list[float]]:
    """The per-prompt rows of policy `a` against policy `b` on the same prompts, named `<prefix>..._<name>`: its paired
    lead in the reward sources' sum (`<prefix>reward_lead_over_<name>`) and win rate by them (`<prefix>rm_win_rate_vs_
    <name>`), and with gold scores on both sides its gold lead and the judge's win rate (`<prefix>gold_lead_over_<name>`,
    `<prefix>win_rate_vs_<name>`). `upto`: the first this many prompts only (best-of-n covers `eval.best_of_prompts`).
    Shapes: each side holds at least `upto` rows; each list holds `upto` values (all rows without it)."""
    m = len(a.scores) if upto is None else upto
    rows = {f"{prefix}reward_lead_over_{name}": (a.scores[:m] - b.scores[:m]).tolist(),
            f"{prefix}rm_win_rate_vs_{name}": win_indicators(a.scores[:m], b.scores[:m]).tolist()}
    if a.gold is not None and b.gold is not None:
        ga, gb = torch.tensor(a.gold[:m], dtype=torch.float32), torch.tensor(b.gold[:m], dtype=torch.float32)
        rows[f"{prefix}gold_lead_over_{name}"] = (ga - gb).tolist()
        rows[f"{prefix}win_rate_vs_{name}"] = win_indicators(ga, gb).tolist()
    return rows


def arms_head_to_head(arms: Mapping[str, Scored]) -> dict[str, list[float]]:
    """Every arm against every later arm (`eval.controls` and the DPO policy, in the order given): `head_to_head` rows
    named `<a>_..._<b>`, e.g. `dpo_win_rate_vs_zero_reward`; b against a is the complement (1 - the win rate, the
    lead negated). Shapes: N rows per arm -> lists of N values."""
    names, rows = list(arms), {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            rows |= head_to_head(arms[a], arms[b], f"{a}_", b)
    return rows
