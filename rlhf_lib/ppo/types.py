"""Typed containers of one PPO iteration. Shapes: B prompts, P prompt tokens (left-padded), R response tokens
(right-padded after EOS)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.data.conversations import RewardRendering
    from rlhf_lib.envs import Turn
    from rlhf_lib.rewards.judge import JudgeReward


@dataclass
class Rollout:
    """What one rollout produces and the later phases fill in.

    Filled by `rollout` (1. generate):
        query:           (B, P) prompt ids, left-padded with PAD.
        query_mask:      (B, P) 1 on real prompt tokens.
        response:        (B, R) sampled ids, PAD after the first EOS.
        response_mask:   (B, R) 1 on real response tokens, the EOS included.
        logprobs:        (B, R) log pi_old(token) at the sampling temperature, 0 on padding.
        action_mask:     (B, R) multi-turn rollouts only (ppo.environment): 1 on the policy's own tokens, 0 on the
                                environment's between its turns (which response_mask covers: the models read them).
                                None = every real response token is the policy's. `policy_mask` is the one to use.
        env_returns:     (B,)   multi-turn only: the sum of the environment's rewards over each episode.
        turns:           multi-turn only: each row's turns as text, for the report (rlhf_lib.envs.Turn).
    Filled by the sampler thread of `ppo.async_rollouts` (staleness > 0; rlhf_lib.ppo.async_rollouts):
        behaviour_logprobs: (B, R) log mu(token): the sampling policy's, `version` updates old; `logprobs` is then
                                recomputed by the policy that trains on the rollout (score).
        version:         how many updates the sampling weights had had (the trainer's `iteration` when copied).
        sample_seconds:  the sampling's own seconds in its thread.
    Filled by `score` (2. score):
        ref_logprobs:    (B, R) log pi_ref(token) at the same temperature.
        values:          (B, R) V(state before each response token) from the critic; None without one.
        raw_scores:      (B,)   the weighted sum of the reward sources (ppo.rewards): the reward model's score is read
                                at the last real token of prompt + response.
        score_parts:     each source's raw (B,) score, by source name.
    Filled by `advantages` (3. rewards, 4. advantages):
        scores:          (B,)   the score that enters the reward (offset, EOS penalty, whitening, clip: shaping.py).
        rewards:         (B, R) per-token reward: -beta * KL, plus the score on the last policy token.
        advantages:      (B, R) GAE advantages (whitened when configured), 0 on padding.
        returns:         (B, R) advantages + values before whitening: the value model's target.
        is_weights:      (B, R) async rollouts only: min(pi_old / mu, ppo.async_rollouts.is_cap) per token.
    """

    query: torch.Tensor
    query_mask: torch.Tensor
    response: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    prompts: list[str] = field(default_factory=list)
    action_mask: torch.Tensor | None = None
    env_returns: torch.Tensor | None = None
    turns: list[list[Turn]] | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    raw_scores: torch.Tensor | None = None
    score_parts: dict[str, torch.Tensor] | None = None
    scores: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    version: int | None = None
    sample_seconds: float = 0.0

    @property
    def batch_size(self) -> int:
        return self.query.shape[0]

    @property
    def policy_mask(self) -> torch.Tensor:
        """(B, R): 1 on the tokens the policy chose, the only ones in the loss, the KL, the entropy, GAE and the
        lengths. The response mask, less the environment's tokens of a multi-turn rollout."""
        return self.response_mask if self.action_mask is None else self.action_mask

    def require(self, *names: str) -> None:
        """Fail loudly when a phase runs before the one that fills its inputs."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise RuntimeError(f"rollout is missing {missing}: run the earlier PPO phases first")

    def minibatch(self, idx: torch.Tensor) -> Rollout:
        """Rows `idx` of every filled tensor field (the prompts and turns lists are not carried)."""
        kw = {}
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if isinstance(v, dict):  # score_parts
                v = {k: t[idx] for k, t in v.items()}
            kw[name] = v[idx] if isinstance(v, torch.Tensor) else ([] if name == "prompts" else None
                                                                    if name == "turns" else v)
        return Rollout(**kw)


@dataclass
class PPOModels:
    """The four models of RLHF-PPO. `ref` and `reward` are frozen; `policy` and `value` train. `reward` is None when
    the reward comes from functions and endpoints only (`ppo.rewards`). `ref` is None with
    LoRA (the policy with its adapters off is the reference). `value` is None
    when the critic is a head on the policy (ppo.critic=shared) or there is none (grpo, rloo)."""

    policy: PreTrainedModel
    ref: PreTrainedModel | None
    reward: PreTrainedModel | None  # None when no reward source is of kind model
    value: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    reward_tokenizer: PreTrainedTokenizerBase | None = None  # the RM's own, when it differs from the policy's
    reward_rendering: RewardRendering | None = None  # the RM's own chat template over each prompt's conversation
    judges: dict[str, JudgeReward] = field(default_factory=dict)  # the frozen judges of `kind: judge`, by source


@dataclass
class BestPolicy:
    """The best policy so far: its iteration, its held-out figure (`metric`) and its weights (CPU copies, as the
    saved policy's state dict)."""

    iteration: int
    metric: str
    value: float
    state: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)

    def describe(self) -> str:
        return f"iteration {self.iteration} ({self.metric} = {self.value:.4f})"
