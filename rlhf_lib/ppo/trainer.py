"""One PPO iteration on one page (InstructGPT; "The N+ Implementation Details of RLHF with PPO"): `step` calls the
phases in order, and each phase below calls the math it runs. Setup (the four models, LoRA, optimizer, KL
controller) is `rlhf_lib.ppo.setup.PPOSetup`; the loop over iterations, with alarms and checkpoints, is
`rlhf_lib.ppo.loop`; where each phase's math lives is docs/ppo.md.

    1. generate   rollout()       sample responses at `temperature`, keeping the sampling log-probs
    2. score      score(ro)       reference log-probs, values, reward sources (the RM reads the last real token)
    3. rewards    advantages(ro)  per-token KL penalty + the shaped score on the last real token
    4. advantages                 GAE (gamma, lambda) or the group estimator, whitened; the KL controller steps
    5. update     update(ro)      epochs x minibatches of the clipped surrogate + clipped value loss - entropy bonus
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from rlhf_lib.lm.generation import encode_prompts, ends_with_eos, sample
from rlhf_lib.lm.kl import kl_stats
from rlhf_lib.lm.masked import masked_whiten
from rlhf_lib.ppo.advantages import compute_rewards, gae, group_advantages
from rlhf_lib.ppo.losses import truncated_is_weights
from rlhf_lib.ppo.metrics import advantage_stats, response_stats, update_stats
from rlhf_lib.ppo.setup import PPOSetup
from rlhf_lib.ppo.shaping import control_seed, shape_scores, truncate_after_eos
from rlhf_lib.ppo.sharding import gather_rollout
from rlhf_lib.ppo.types import PPOModels, Rollout
from rlhf_lib.ppo.update import ppo_epochs
from rlhf_lib.rewards.combine import part_stats

__all__ = ["PPOModels", "PPOTrainer", "direct"]

# How a phase runs: call(phase, fn, *args) returns fn(*args): directly, as a Prefect task (`stages.ppo`), or timed
# with a device sync (`benchmarks.ppo`).
Call = Callable[..., Any]


def direct(phase: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class PPOTrainer(PPOSetup):
    def step(self, call: Call = direct) -> tuple[Rollout, dict[str, float]]:
        """One PPO iteration, its phases through `call`. Returns the rollout and the iteration's metrics, with the
        seconds of each phase (`time/*`)."""
        seconds: dict[str, float] = {}

        def timed(phase: str, fn: Callable[..., Any], *args: Any) -> Any:
            t0 = time.perf_counter()
            out = call(phase, fn, *args)
            seconds[phase] = time.perf_counter() - t0
            return out

        if self.queue is None:
            ro = timed("rollout", self.rollout)
        else:  # async rollouts: this one was sampled during an earlier update; the next goes out now
            t0 = time.perf_counter()
            ro = self.queue.take(self.iteration, getattr(call, "submit", None))
            seconds["rollout_wait"] = time.perf_counter() - t0
        timed("score", self.score, ro)
        stats = timed("gae", self.advantages, ro)
        stats.update(timed("update", self.update, ro))
        total = sum(seconds.values())  # the iteration's wall time: an async rollout's sampling is not in it
        stats.update({f"time/{phase}_s": s for phase, s in seconds.items()})
        if self.queue is not None:
            stats["time/rollout_s"] = ro.sample_seconds
            # The sampling hidden behind the trainer's phases (those of the iterations it overlapped).
            stats["time/overlap_s"] = max(ro.sample_seconds - seconds["rollout_wait"], 0.0)
        stats["time/iteration_s"] = total
        stats["time/tokens_per_s"] = float(ro.response_mask.sum()) / max(total, 1e-9)
        if self.decoder is not None:  # ppo.rollout_engine=compiled: the seconds of its compiles so far, apart
            stats["time/compile_s"] = self.decoder.compile_seconds
        return ro, stats

    # 1. generate ---------------------------------------------------------------------------------------------
    def rollout(self) -> Rollout:
        c = self.cfg
        # Critic-free estimators compare k samples of one prompt, so each prompt is drawn once and repeated k times.
        k = 1 if c.has_critic else c.group_size
        prompts = [p for p in self.sampler.next(c.batch_size // k) for _ in range(k)]
        local = self.group.local_rows(prompts)  # this process's rows: all of them in one process
        tok = self.models.tokenizer
        query, query_mask = (t.to(self.device) for t in encode_prompts(tok, local, self.max_prompt_tokens))
        if self.env is not None:
            # Multi-turn: policy and environment turns in one stream; the old log-probs come from one forward over
            # it (0 on the environment's tokens, which the action mask keeps out of every loss).
            with self.precision():
                ep = self.episodes(self.models.policy, local, query, query_mask, self.generator)
            logprobs = self._policy_logprobs(query, query_mask, ep.response, ep.response_mask) * ep.action_mask
            return Rollout(query, query_mask, ep.response, ep.response_mask, logprobs, prompts=local,
                           action_mask=ep.action_mask, env_returns=ep.returns, turns=ep.turns)
        if self.engine is not None:
            # vLLM's log-probs differ from the trainer's numerics (kernels, precision): PPO's ratio needs the
            # policy's own, so they are recomputed with one forward (the known engine mismatch).
            response, response_mask, _ = (t.to(self.device) for t in self.engine.generate(query, query_mask))
            logprobs = self._policy_logprobs(query, query_mask, response, response_mask)
        else:
            with self.precision():
                response, response_mask, logprobs = sample(
                    self.models.policy, query, query_mask, max_new_tokens=c.max_new_tokens,
                    temperature=c.temperature, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                    generator=self.generator, stop_at_eos=c.stop_at_eos, shard=self.group.row_shard(len(prompts)),
                    decoder=self.decoder,
                )
            if self.recompute_logprobs:
                logprobs = self._policy_logprobs(query, query_mask, response, response_mask)
        if not c.stop_at_eos:
            response, response_mask, logprobs = truncate_after_eos(
                response, response_mask, logprobs, tok.eos_token_id, tok.pad_token_id
            )
        return Rollout(query, query_mask, response, response_mask, logprobs, prompts=local)

    # 2. score ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, ro: Rollout) -> None:
        if self.rm_offset is None:
            self._set_rm_offset(*self._rm_offset())
        # In chunks of rows: the three forward passes' activations (a (rows, T, 4H) MLP tensor per layer, the (rows,
        # R, V) logits) never exist for the whole rollout at once. Rows are independent, so the results are the same.
        n = self.cfg.score_batch_size
        with self.precision():
            parts = [self._score_rows(ro.query[i : i + n], ro.query_mask[i : i + n], ro.response[i : i + n],
                                      ro.response_mask[i : i + n]) for i in range(0, ro.batch_size, n)]
            # The reward sources (the RM in chunks of the same rows, the text sources once for the batch); a source
            # that fails fails the iteration here, before anything is updated.
            extra = {} if ro.turns is None else {"env_returns": ro.env_returns,
                                                 "completions": [t[-1].text for t in ro.turns]}
            scores = self.rewards(ro.prompts, ro.query, ro.query_mask, ro.response, ro.response_mask, **extra)
        ro.ref_logprobs, ro.values = (None if p[0] is None else torch.cat(p) for p in zip(*parts))
        if ro.behaviour_logprobs is not None and (ro.version != self.iteration or self.recompute_logprobs):
            # An async rollout sampled by an older policy (mu): the update's pi_old is the policy now. (One sampled
            # by the current weights keeps its sampling log-probs, as the synchronous loop does in float32.)
            ro.logprobs = self._policy_logprobs(ro.query, ro.query_mask, ro.response, ro.response_mask) \
                * ro.response_mask
        ro.raw_scores, ro.score_parts = scores.total, scores.parts
        self.score_seconds = scores.seconds

    # 3. rewards and 4. advantages ------------------------------------------------------------------------------
    @torch.no_grad()
    def advantages(self, ro: Rollout) -> dict[str, float]:
        ro.require("ref_logprobs", "raw_scores")
        # Several processes: from here on every process holds the whole scored rollout and computes what one would.
        gather_rollout(ro, self.models.tokenizer.pad_token_id, self.group)
        # Every figure from here on is over the policy's own tokens (a multi-turn rollout's environment tokens are
        # read by the models but are not the policy's actions).
        c, mask = self.cfg, ro.policy_mask
        has_eos = ends_with_eos(ro.response, ro.response_mask, self.models.tokenizer.eos_token_id)
        ro.scores, score_stats = shape_scores(
            ro.raw_scores, has_eos, offset=self.rm_offset or 0.0, scale=self.rm_scale,
            missing_eos_penalty=c.missing_eos_penalty,
            moments=self.reward_moments, clip=c.reward_clip,
            control=c.reward_control, permutation_seed=control_seed(c.seed, self.iteration),
        )
        ro.rewards, reward_stats = compute_rewards(
            ro.scores, ro.logprobs, ro.ref_logprobs, mask, self.kl_ctl.value, c.kl_estimator
        )
        if c.has_critic:
            ro.require("values")
            advantages, ro.returns = gae(ro.rewards, ro.values, mask, c.gamma, c.lam)
        else:
            advantages = group_advantages(ro.rewards, mask, c.group_size, c.advantage_estimator)
        # Whitening over the whole rollout keeps the policy-gradient scale independent of the reward scale
        # (N+ implementation details; TRL `whiten(advantages)`). GRPO advantages are normalised per group already.
        whiten = c.whiten_advantages and c.advantage_estimator != "grpo"
        ro.advantages = masked_whiten(advantages, mask) if whiten else advantages
        kl = kl_stats(ro.logprobs, ro.ref_logprobs, mask)
        stats = advantage_stats(ro, advantages, kl, self.kl_ctl.value, score_stats, reward_stats)
        if ro.behaviour_logprobs is not None:  # async rollouts: the truncated importance weights pi_old / mu
            ro.is_weights, is_stats = truncated_is_weights(ro.logprobs, ro.behaviour_logprobs, mask,
                                                           c.async_rollouts.is_cap)
            stats.update({f"async/{k}": v for k, v in is_stats.items()})
            stats["async/staleness"] = float(self.iteration - (ro.version or 0))
        stats.update({"objective/rm_offset": self.rm_offset or 0.0, "objective/rm_scale": self.rm_scale})
        if ro.score_parts:
            stats.update(part_stats(ro.score_parts, self.rewards.weights))
        # Each source's share of the score phase (this process's rows): a judge's or an endpoint's cost beside the RM's.
        stats.update({f"time/score/{name}_s": s for name, s in self.score_seconds.items()})
        # The controller sees the KL of the samples it just shaped (Ziegler et al. 2019, eq. 2).
        self.kl_ctl.update(kl["kl_k1"], ro.batch_size)
        return stats

    # 5. update -----------------------------------------------------------------------------------------------
    def update(self, ro: Rollout) -> dict[str, float]:
        c = self.cfg
        frac = 1.0 - self.iteration / c.iterations if c.lr_schedule == "linear" else 1.0
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * frac
        warming_up = self.critic.trains and self.iteration < c.critic_warmup
        s = ppo_epochs(self.policy_module, self.critic, self.optimizer, ro, c, self.generator,
                       train_policy=not warming_up, ptx_batch=self.ptx, group=self.group, precision=self.precision)
        self.sync_engine()
        self.iteration += 1
        self._guard(s["refused_steps"])
        stats = update_stats(s, all_refused=s["refused_steps"] >= c.epochs * c.minibatches,
                             critic_trains=self.critic.trains)
        for group in self.optimizer.param_groups:
            stats[f"lr/{group['name']}"] = group["lr"]
        stats["update/critic_warmup"] = float(warming_up)
        stats.update(response_stats(ro, self.models.tokenizer.eos_token_id))
        return stats
