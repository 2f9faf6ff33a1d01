"""The PPO loop of RLHF: one object holds the four models and the optimizer; each phase is a method, so the
Prefect sub-flow runs them as tasks and the benchmark runs them bare, through the same code.

    1. generate   -> rollout()
    2. score      -> score(ro)
    3. rewards    \\
    4. advantages -> advantages(ro)
    5. update     -> update(ro)
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.models import freeze
from rlhf_lib.ppo.advantages import compute_rewards, gae
from rlhf_lib.ppo.kl import AdaptiveKLController, FixedKLController, kl_stats
from rlhf_lib.ppo.masked import masked_mean, masked_var, masked_whiten
from rlhf_lib.ppo.metrics import explained_variance
from rlhf_lib.ppo.retokenize import retokenized_scores
from rlhf_lib.ppo.rollout import decode_responses, encode_prompts, ends_with_eos, sample
from rlhf_lib.ppo.scoring import concat, response_logprobs, sequence_scores, token_values
from rlhf_lib.ppo.types import Rollout
from rlhf_lib.ppo.update import ppo_epochs

if TYPE_CHECKING:  # transformers' model classes cost ~2 s to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class PPOModels:
    """The four models of RLHF-PPO. `ref` and `reward` are frozen; `policy` and `value` train."""

    policy: PreTrainedModel
    ref: PreTrainedModel
    reward: PreTrainedModel
    value: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    reward_tokenizer: PreTrainedTokenizerBase | None = None  # the RM's own, when it differs from the policy's


class PromptSampler:
    """Endless seeded passes over the prompts, each in a fresh order; its position is part of the state."""

    def __init__(self, prompts: Sequence[str], seed: int):
        if not prompts:
            raise ValueError("PPO needs at least one prompt")
        self.prompts = list(prompts)
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.pos = 0

    def next(self, n: int) -> list[str]:
        out = []
        while len(out) < n:
            if self.pos >= len(self.order):
                self.order = list(range(len(self.prompts)))
                self.rng.shuffle(self.order)
                self.pos = 0
            out.append(self.prompts[self.order[self.pos]])
            self.pos += 1
        return out


class PPOTrainer:
    def __init__(self, models: PPOModels, prompts: Sequence[str], cfg: PPOConfig, max_prompt_tokens: int):
        self.m = models
        self.cfg = cfg
        self.max_prompt_tokens = max_prompt_tokens
        freeze(models.ref)
        freeze(models.reward)
        self.sampler = PromptSampler(prompts, cfg.seed)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        # Adam eps 1e-5 rather than 1e-8: "The 37 Implementation Details of PPO" (#3) and the OpenAI baselines.
        self.optimizer = torch.optim.Adam(
            list(models.policy.parameters()) + list(models.value.parameters()), lr=cfg.lr, eps=1e-5
        )
        self.kl_ctl = (
            AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.kl_horizon)
            if cfg.adaptive_kl
            else FixedKLController(cfg.kl_coef)
        )
        self.iteration = 0
        self.refused_streak = 0
        self.timings: dict[str, float] = {}

    # 1. generate ---------------------------------------------------------------------------------------------
    def rollout(self) -> Rollout:
        t0 = time.perf_counter()
        prompts = self.sampler.next(self.cfg.batch_size)
        query, query_mask = encode_prompts(self.m.tokenizer, prompts, self.max_prompt_tokens)
        response, response_mask, logprobs = sample(
            self.m.policy, query, query_mask,
            max_new_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature,
            eos_token_id=self.m.tokenizer.eos_token_id, pad_token_id=self.m.tokenizer.pad_token_id,
            generator=self.generator,
        )
        self.timings["rollout_s"] = time.perf_counter() - t0
        return Rollout(query, query_mask, response, response_mask, logprobs, prompts=prompts)

    # 2. score ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, ro: Rollout) -> None:
        t0 = time.perf_counter()
        args = (ro.query, ro.query_mask, ro.response, ro.response_mask)
        ro.ref_logprobs, _ = response_logprobs(self.m.ref, *args, temperature=self.cfg.temperature)
        ro.values = token_values(self.m.value, *args)
        if self.m.reward_tokenizer is None:
            ro.scores = sequence_scores(self.m.reward, *concat(*args))
        else:  # the RM reads text through its own tokenizer
            ro.scores = retokenized_scores(self.m.reward, self.m.reward_tokenizer, self.m.tokenizer, *args)
        self.timings["score_s"] = time.perf_counter() - t0

    # 3. rewards and 4. advantages ------------------------------------------------------------------------------
    @torch.no_grad()
    def advantages(self, ro: Rollout) -> dict[str, float]:
        t0 = time.perf_counter()
        ro.require("ref_logprobs", "values", "scores")
        mask = ro.response_mask
        ro.rewards, reward_stats = compute_rewards(
            ro.scores, ro.logprobs, ro.ref_logprobs, mask, self.kl_ctl.value, self.cfg.kl_estimator
        )
        advantages, ro.returns = gae(ro.rewards, ro.values, mask, self.cfg.gamma, self.cfg.lam)
        # Whitening over the whole rollout keeps the policy-gradient scale independent of the reward scale
        # (N+ implementation details; TRL `whiten(advantages)`).
        ro.advantages = masked_whiten(advantages, mask) if self.cfg.whiten_advantages else advantages
        kl = kl_stats(ro.logprobs, ro.ref_logprobs, mask)
        stats = {
            "objective/kl_coef": self.kl_ctl.value,
            "objective/kl": kl["kl_k1"], "objective/kl_k2": kl["kl_k2"], "objective/kl_k3": kl["kl_k3"],
            "objective/score": reward_stats["score_mean"],
            "objective/non_score_reward": reward_stats["non_score_reward"],
            "objective/reward_total": reward_stats["reward_total"],
            "advantages/mean": float(masked_mean(advantages, mask)),
            "advantages/std": float(masked_var(advantages, mask, unbiased=False).sqrt()),
            "returns/mean": float(masked_mean(ro.returns, mask)),
            "value/mean": float(masked_mean(ro.values, mask)),
            "value/explained_variance": explained_variance(ro.values, ro.returns, mask),
        }
        # The controller sees the KL of the samples it just shaped (Ziegler et al. 2019, eq. 2).
        self.kl_ctl.update(kl["kl_k1"], ro.batch_size)
        self.timings["gae_s"] = time.perf_counter() - t0
        return stats

    # 5. update -----------------------------------------------------------------------------------------------
    def update(self, ro: Rollout) -> dict[str, float]:
        t0 = time.perf_counter()
        s = ppo_epochs(self.m.policy, self.m.value, self.optimizer, ro, self.cfg, self.generator)
        self.timings["update_s"] = time.perf_counter() - t0
        self.iteration += 1
        self._guard(s["refused_steps"])
        s = defaultdict(lambda: math.nan, s)  # every step refused: the loss stats are NaN, and the alarm says so
        lengths = ro.response_mask.sum(1).float()
        stats = {
            "loss/policy": s["policy_loss"], "loss/value": s["value_loss"], "loss/total": s["loss"],
            "policy/entropy": s["entropy"], "policy/clipfrac": s["clipfrac"], "policy/approx_kl": s["approx_kl"],
            "policy/ratio_mean": s["ratio_mean"], "value/clipfrac": s["value_clipfrac"],
            "grad_norm": s["grad_norm"], "lr": self.optimizer.param_groups[0]["lr"],
            "update/refused_steps": s["refused_steps"],
            "response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max()),
            "response/no_eos_frac": float(
                (~ends_with_eos(ro.response, ro.response_mask, self.m.tokenizer.eos_token_id)).float().mean()
            ),
        }
        total = sum(self.timings.get(k, 0.0) for k in ("rollout_s", "score_s", "gae_s", "update_s"))
        stats.update({f"time/{k}": v for k, v in self.timings.items()})
        stats["time/iteration_s"] = total
        stats["time/tokens_per_s"] = float(ro.response_mask.sum()) / max(total, 1e-9)
        return stats

    def _guard(self, refused_steps: float) -> None:
        """Count iterations whose every update step was refused as non-finite; fail after too many in a row, so a
        broken run stops cleanly (its last good checkpoint stays logged) instead of spinning."""
        all_refused = refused_steps >= self.cfg.epochs * self.cfg.minibatches
        self.refused_streak = self.refused_streak + 1 if all_refused else 0
        if self.refused_streak >= self.cfg.max_refused_iterations:
            raise FloatingPointError(
                f"PPO iteration {self.iteration}: {self.refused_streak} iterations in a row had only non-finite "
                "losses or gradients (NaN/inf); stopping. The weights were never updated with them."
            )

    def step(self) -> tuple[Rollout, dict[str, float]]:
        """One whole iteration, bare (the benchmark and tests); the Prefect sub-flow calls the phases itself."""
        ro = self.rollout()
        self.score(ro)
        stats = self.advantages(ro)
        stats.update(self.update(ro))
        return ro, stats

    def samples(self, ro: Rollout, n: int) -> list[dict[str, object]]:
        """The first `n` (prompt, response, score) rows of a scored rollout, for the sample table."""
        texts = decode_responses(self.m.tokenizer, ro.response[:n], ro.response_mask[:n])
        return [{"prompt": p, "response": r, "score": float(s)} for p, r, s in zip(ro.prompts[:n], texts, ro.scores[:n])]
