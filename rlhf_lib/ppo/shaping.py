"""3. rewards, before the KL penalty: what happens to a reward-model score between the RM and `compute_rewards`.

Order, each step optional (N+ implementation details, Huang et al. 2024; trlx's reward scaling):
    s = RM(prompt, response)              raw score
    s = s - offset                        RM offset normalisation: SFT samples average 0
    s = s / scale                         ppo.rm_unit_std: SFT samples' scores have std 1
    s = 0, or s[perm]                     ppo.reward_control: a control arm (zero_reward, shuffled_reward)
    s = s - missing_eos_penalty           on responses that never emitted EOS
    s = (s - mu_run) / sigma_run          running whitening over every rollout so far
    s = clip(s, -c, c)                    reward clipping
Fixed-length rollouts (`stop_at_eos=False`) are first cut after their first EOS (`truncate_after_eos`), so the
score lands on the EOS and nothing after it counts.

Notation: B = batch, T = response length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def truncate_after_eos(
    response: Tensor, response_mask: Tensor, logprobs: Tensor, eos_token_id: int, pad_token_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Mask every token after a row's first EOS (the EOS itself stays real).

    Shapes: response, response_mask, logprobs (B, T) -> the same three. Tokens after the EOS become PAD and their
    log-probs 0, exactly as if sampling had stopped there (N+ implementation details: "truncate after EOS" when
    a fixed response length is sampled, so the RM score goes on the EOS, not on what follows it).
    """
    is_eos = (response == eos_token_id) & response_mask.bool()
    # Tokens strictly after the first EOS: the running count of EOS tokens before this position is >= 1.
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
    keep = response_mask.bool() & ~after
    return (
        torch.where(keep, response, torch.full_like(response, pad_token_id)),
        keep.to(response_mask.dtype),
        torch.where(keep, logprobs, torch.zeros_like(logprobs)),
    )


class RunningMoments:
    """Mean and variance over every score seen so far, merged batch by batch (Chan et al. parallel algorithm, as
    trlx's `RunningMoments`). Its state is part of the PPO checkpoint, so a resumed run normalises identically."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 0

    def update(self, x: Tensor) -> None:
        """Fold a batch of values in. Shape: (N,)."""
        x = x.double()
        n = x.numel()
        if n == 0:
            return
        b_mean, b_var = float(x.mean()), float(x.var(unbiased=False))
        total = self.count + n
        delta = b_mean - self.mean
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total

    @property
    def std(self) -> float:
        return math.sqrt(self.var) if self.count > 1 else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), int(state["count"])


def shape_scores(
    raw: Tensor,
    has_eos: Tensor,
    *,
    offset: float = 0.0,
    scale: float = 1.0,
    missing_eos_penalty: float | None = None,
    moments: RunningMoments | None = None,
    clip: float | None = None,
    control: str = "none",
    permutation_seed: int = 0,
) -> tuple[Tensor, dict[str, float]]:
    """The score that enters the reward, from the raw RM score. Shape: raw (B,), has_eos (B,) bool -> (B,).

    `moments` (running whitening) is updated with this batch before it normalises it, so the first batch is
    whitened by its own statistics. Stats: score_clipfrac (share of scores the clip changed).
    `control` (a control arm, `ppo.reward_control`): `zero_reward` sets every normalised score to 0, so only the
    shaping after it acts; `shuffled_reward` permutes the normalised scores within the batch by a permutation drawn
    from `permutation_seed` (the same on every process and after a resume).
    """
    s = controlled((raw.float() - offset) / scale, control, permutation_seed)
    if missing_eos_penalty is not None:
        s = torch.where(has_eos, s, s - missing_eos_penalty)
    if moments is not None:
        moments.update(s)
        s = (s - moments.mean) / (moments.std + 1e-8)
    stats = {"score_clipfrac": 0.0}
    if clip is not None:
        clipped = s.clamp(-clip, clip)
        stats["score_clipfrac"] = float((clipped != s).float().mean())
        s = clipped
    return s, stats


def control_seed(seed: int, iteration: int) -> int:
    """The seed of `shuffled_reward`'s permutation at `iteration`: a function of the run's seed and the iteration
    only, so a resumed run and every process draw the same one, and the training stream is untouched."""
    return (seed * 1_000_003 + iteration) % 2**63


def controlled(s: Tensor, control: str, permutation_seed: int = 0) -> Tensor:
    """A control arm's scores. Shape: (B,) -> (B,). `none`: `s`; `zero_reward`: zeros; `shuffled_reward`: `s` in the
    order of a permutation seeded by `permutation_seed` (the scores' spread kept, their link to the replies cut)."""
    if control == "none":
        return s
    if control == "zero_reward":
        return torch.zeros_like(s)
    if control == "shuffled_reward":
        perm = torch.randperm(s.numel(), generator=torch.Generator().manual_seed(permutation_seed))
        return s[perm.to(s.device)]
    raise ValueError(f"unknown reward control {control!r}: expected none, zero_reward or shuffled_reward")


def rm_offset_prompts(prompts: Sequence[str], n: int, seed: int) -> tuple[list[str], torch.Generator]:
    """The `n` training prompts whose SFT samples set the RM offset, and the generator to sample them with: both
    seeded apart from the training stream (seed + 1), so it is the same with the offset on or off."""
    return random.Random(seed + 1).choices(list(prompts), k=n), torch.Generator().manual_seed(seed + 1)
