"""Config of one-step-off-policy rollouts (`ppo.async_rollouts`, docs/ppo.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlhf_lib.config.base import Section


class AsyncRolloutsConfig(Section):
    """The rollout of iteration t + staleness is sampled, by a copy of the policy in its own thread, while iteration
    t scores and updates: the trainer waits only for what sampling does not hide behind its own phases. A rollout's
    tokens then come from the policy of `staleness` updates ago (the behaviour policy mu); the trainer recomputes
    the old log-probs with the policy it is about to update (pi_old) and weights each token's clipped surrogate by
    min(pi_old / mu, is_cap), truncated importance sampling (Ionides 2008; Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training")."""

    staleness: Literal[0, 1, 2] = Field(
        0, description="Updates between the policy that samples a rollout and the one that trains on it: 0 is the "
        "synchronous loop (sample, score, update, in turn); 1 samples iteration t + 1 while iteration t updates "
        "(one-step-off-policy, as verl and NeMo-RL); 2 keeps two rollouts in flight.")
    is_cap: float = Field(2.0, ge=1.0, description="Truncation of the importance weight pi_old / mu of each token "
                          "(the truncated-IS cap C of Yao et al. 2025; verl's default 2): bounds the variance that "
                          "a stale token can add to the surrogate's gradient.")
    alarm_truncated_frac: float = Field(0.1, gt=0, le=1, description="is_blowup alarm: the share of tokens whose "
                                        "importance weight exceeded is_cap, above this: the sampler is too far "
                                        "behind the trainer for the correction to hold (lower the learning rate or "
                                        "the staleness).")
