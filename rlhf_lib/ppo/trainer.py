"""The state of RLHF-PPO: the four models, the optimizer and the KL controller, with each phase of an iteration as a
method. The order of the phases and the loop over iterations are defined once, in `rlhf_lib.ppo.loop`:

    1. generate   -> rollout()
    2. score      -> score(ro)
    3. rewards    \\
    4. advantages -> advantages(ro)
    5. update     -> update(ro)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.devices import autocast
from rlhf_lib.models import fit_length, freeze, set_checkpointing
from rlhf_lib.ppo.advantages import compute_rewards, gae, group_advantages
from rlhf_lib.ppo.critic import Critic, disable_dropout
from rlhf_lib.ppo.heldout import BestPolicy
from rlhf_lib.lm.kl import kl_stats
from rlhf_lib.ppo.kl import AdaptiveKLController, FixedKLController
from rlhf_lib.ppo.lora import adapters_off, add_lora, merged_copy
from rlhf_lib.lm.masked import masked_whiten
from rlhf_lib.ppo.metrics import advantage_stats, response_stats, update_stats
from rlhf_lib.rewards.retokenize import RewardScorer
from rlhf_lib.lm.generation import encode_prompts, ends_with_eos, sample
from rlhf_lib.ppo.sampler import PromptSampler
from rlhf_lib.lm.scoring import response_logprobs
from rlhf_lib.ppo.shaping import RunningMoments, rm_offset_prompts, shape_scores, truncate_after_eos
from rlhf_lib.ppo.sharding import check_sizes, gather_rollout, local_rows, prepare_models, row_shard
from rlhf_lib.ppo.types import PPOModels, Rollout
from rlhf_lib.ppo.ptx import PtxSampler
from rlhf_lib.ppo.update import ppo_epochs
from rlhf_lib.ppo.vllm_engine import rollout_engine
from rlhf_lib.rewards.combine import RewardSet, part_stats

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel


class PPOTrainer:
    def __init__(self, models: PPOModels, prompts: Sequence[str], cfg: PPOConfig, max_prompt_tokens: int,
                 ptx_examples: Sequence[tuple[str, str]] = (), ptx_max_length: int = 128,
                 group: ProcessGroup | None = None, mixed_precision: str = "no",
                 frozen_dtype: torch.dtype = torch.float32, columns: Mapping[str, Mapping[str, Any]] | None = None):
        # `columns`: the prompts' extra fields (e.g. the arithmetic task's `answer`) by prompt text, for the reward
        # functions and endpoints of `cfg.rewards`.
        # `group`: the training processes (several under `accelerate launch`) and their device; None: this process
        # alone, on the GPU where there is one. Every model, rollout tensor and ptx batch lives on `self.device`.
        self.group = group or ProcessGroup()
        check_sizes(cfg, self.group.world)
        if mixed_precision == "fp16":
            raise ValueError("PPO takes resources.mixed_precision bf16 or no: fp16 autocast needs loss scaling, "
                             "which would scale the PPO ratio's gradients per step; use bf16")
        self.models, self.cfg, self.max_prompt_tokens = models, cfg, max_prompt_tokens
        self.device = self.group.device
        # The trained models keep their dtype (model.dtype, float32 by default); the frozen ones take frozen_dtype.
        for model in filter(None, (models.policy, models.value)):
            model.to(self.device)
        for model in filter(None, (models.ref, models.reward)):
            model.to(self.device, frozen_dtype)
        for model in filter(None, (models.policy, models.ref, models.reward, models.value)):
            disable_dropout(model)
        # Autocast around every forward pass (sampling, scoring, update): the same numerics in all three.
        self.precision = autocast(self.device, mixed_precision)
        # Old log-probs from the sampling loop (incremental, KV cache) match the update's full forward in float32;
        # under autocast the two low-precision paths differ, so they are recomputed with the update's forward.
        self.recompute_logprobs = mixed_precision != "no"
        if cfg.gradient_checkpointing:
            for model in filter(None, (models.policy, models.value)):
                set_checkpointing(model, True)
        # LoRA: the reference is the policy with its adapters off, so no copy of it is kept (or needed).
        self.peft = add_lora(models.policy, cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules,
                             seed=cfg.seed) if cfg.lora else None
        if self.peft is None and models.ref is None:
            raise ValueError("PPO without ppo.lora needs a reference model")
        if self.peft is not None:
            models.ref = None
        for frozen in filter(None, (models.ref, models.reward)):
            freeze(frozen)
        rm = None if models.reward is None else RewardScorer(models.reward, models.tokenizer, models.reward_tokenizer,
                                                                  models.reward_rendering)
        self.rewards = RewardSet(cfg.rewards, rm, models.tokenizer, columns, cfg.score_batch_size)
        self.critic = Critic.build(cfg.critic if cfg.has_critic else "none", models.policy, models.value)
        self.sampler = PromptSampler(prompts, cfg.seed)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        groups = [{"params": [p for p in models.policy.parameters() if p.requires_grad], "lr": cfg.lr,
                   "name": "policy"}]
        if self.critic.trains:
            groups.append({"params": list(self.critic.module.parameters()), "lr": cfg.value_lr or cfg.lr,
                           "name": "value"})
        # Adam eps 1e-5 rather than 1e-8: "The 37 Implementation Details of PPO" (#3) and the OpenAI baselines.
        # fused: one kernel per parameter tensor; the default for-each Adam costs several times more on CPU.
        self.optimizer = torch.optim.Adam(groups, eps=cfg.adam_eps, fused=True)
        # What the update calls: the policy, or its DDP wrapper (then the critic's forward is wrapped too).
        self.policy_module, self.optimizer = prepare_models(self.group, models.policy, self.critic, self.optimizer,
                                                            frozen=(models.ref, models.reward))
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.kl_ctl = (AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.kl_horizon) if cfg.adaptive_kl
                       else FixedKLController(cfg.kl_coef))
        self.reward_moments = RunningMoments() if cfg.whiten_rewards else None
        self.rm_offset: float | None = None if cfg.rm_offset_samples else 0.0
        # Demonstrations are cut to what the policy's position embeddings cover, as in SFT.
        self.ptx = (PtxSampler(ptx_examples, models.tokenizer, fit_length(ptx_max_length, models.policy),
                               cfg.ptx_batch_size, self.generator, self.device) if cfg.ptx_coef > 0 else None)
        self.iteration = self.refused_streak = 0
        self.best: BestPolicy | None = None  # ppo.keep=best: the best held-out evaluation so far
        # vLLM (GPU only) fails here, at stage start, on a machine without one.
        self.engine = rollout_engine(cfg, self.export_policy(), models.tokenizer)

    # 1. generate ---------------------------------------------------------------------------------------------
    def rollout(self) -> Rollout:
        c = self.cfg
        # Critic-free estimators compare k samples of one prompt, so each prompt is drawn once and repeated k times.
        k = 1 if c.has_critic else c.group_size
        prompts = [p for p in self.sampler.next(c.batch_size // k) for _ in range(k)]
        local = local_rows(prompts, self.group)  # this process's rows: all of them in one process
        tok = self.models.tokenizer
        query, query_mask = (t.to(self.device) for t in encode_prompts(tok, local, self.max_prompt_tokens))
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
                    generator=self.generator, stop_at_eos=c.stop_at_eos, shard=row_shard(self.group, len(prompts)),
                )
            if self.recompute_logprobs:
                logprobs = self._policy_logprobs(query, query_mask, response, response_mask)
        if not c.stop_at_eos:
            response, response_mask, logprobs = truncate_after_eos(
                response, response_mask, logprobs, tok.eos_token_id, tok.pad_token_id
            )
        return Rollout(query, query_mask, response, response_mask, logprobs, prompts=local)

    @torch.inference_mode()
    def _policy_logprobs(self, *rows: torch.Tensor) -> torch.Tensor:
        """The policy's log-probs of sampled rows (query, query_mask, response, response_mask) by the update's own
        forward, under the same autocast, `score_batch_size` rows at a time. Shape: (B, R)."""
        n, c = self.cfg.score_batch_size, self.cfg
        with self.precision():
            return torch.cat([response_logprobs(self.models.policy, *(t[i : i + n] for t in rows),
                                                temperature=c.temperature, chunk=c.logprob_chunk)[0]
                              for i in range(0, rows[0].shape[0], n)])

    # 2. score ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, ro: Rollout) -> None:
        if self.rm_offset is None:
            self._set_rm_offset(self._rm_offset())
        # In chunks of rows: the three forward passes' activations (a (rows, T, 4H) MLP tensor per layer, the (rows,
        # R, V) logits) never exist for the whole rollout at once. Rows are independent, so the results are the same.
        n = self.cfg.score_batch_size
        with self.precision():
            parts = [self._score_rows(ro.query[i : i + n], ro.query_mask[i : i + n], ro.response[i : i + n],
                                      ro.response_mask[i : i + n]) for i in range(0, ro.batch_size, n)]
            # The reward sources (the RM in chunks of the same rows, the text sources once for the batch); a source
            # that fails fails the iteration here, before anything is updated.
            scores = self.rewards(ro.prompts, ro.query, ro.query_mask, ro.response, ro.response_mask)
        ro.ref_logprobs, ro.values = (None if p[0] is None else torch.cat(p) for p in zip(*parts))
        ro.raw_scores, ro.score_parts = scores.total, scores.parts

    def _score_rows(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Reference log-probs (B, R) and values (B, R) or None of rows (query, query_mask, response,
        response_mask)."""
        with adapters_off(self.peft):
            ref_logprobs, _ = response_logprobs(self.reference, *args, temperature=self.cfg.temperature,
                                                chunk=self.cfg.logprob_chunk)
        return ref_logprobs, self.critic.values(self.models.policy, *args)

    @property
    def reference(self) -> PreTrainedModel:
        """The frozen reference: its own model, or (LoRA) the policy, to be called inside `adapters_off`."""
        return self.models.policy if self.peft is not None else self.models.ref

    def sync_engine(self) -> None:
        """Load the policy's current weights into the vLLM engine (after each update and after a resume)."""
        if self.engine is not None:
            self.engine.sync_weights(self.export_policy())

    def export_policy(self) -> PreTrainedModel:
        """The trained policy as a plain transformers model (LoRA adapters merged in) for saving and registering."""
        return merged_copy(self.peft) if self.peft is not None else self.models.policy

    def _set_rm_offset(self, offset: float | None) -> None:
        self.rm_offset = offset
        # A value model copied from the RM predicts raw scores; one built from SFT (or for an RM that reads other
        # token ids) starts at 0 and needs no shift.
        if (self.critic.kind == "separate" and self.cfg.value_init == "reward" and self.models.reward is not None
                and self.models.reward_tokenizer is None):
            self.critic.offset = offset or 0.0

    def _rm_offset(self) -> float:
        """RM offset normalisation (N+ implementation details, after Ziegler et al. 2019): the mean summed score of
        `rm_offset_samples` responses of the SFT policy (= the frozen reference) to training prompts. Its own RNGs,
        so the training stream is the same with the offset on or off."""
        c, tok = self.cfg, self.models.tokenizer
        prompts, gen = rm_offset_prompts(self.sampler.prompts, c.rm_offset_samples, c.seed)
        total = 0.0
        for i in range(0, len(prompts), c.batch_size):
            chunk = prompts[i : i + c.batch_size]
            local = local_rows(chunk, self.group)
            query, query_mask = (t.to(self.device) for t in encode_prompts(tok, local, self.max_prompt_tokens))
            with adapters_off(self.peft), self.precision():
                response, response_mask, _ = sample(
                    self.reference, query, query_mask, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, generator=gen,
                    shard=row_shard(self.group, len(chunk)),
                )
            with self.precision():
                total += float(self.rewards(local, query, query_mask, response, response_mask).total.sum())
        return self.group.sum([total])[0] / len(prompts)

    # 3. rewards and 4. advantages ------------------------------------------------------------------------------
    @torch.no_grad()
    def advantages(self, ro: Rollout) -> dict[str, float]:
        ro.require("ref_logprobs", "raw_scores")
        # Several processes: from here on every process holds the whole scored rollout and computes what one would.
        gather_rollout(ro, self.models.tokenizer.pad_token_id, self.group)
        c, mask = self.cfg, ro.response_mask
        has_eos = ends_with_eos(ro.response, mask, self.models.tokenizer.eos_token_id)
        ro.scores, score_stats = shape_scores(
            ro.raw_scores, has_eos, offset=self.rm_offset or 0.0, missing_eos_penalty=c.missing_eos_penalty,
            moments=self.reward_moments, clip=c.reward_clip,
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
        if ro.score_parts:
            stats.update(part_stats(ro.score_parts, self.rewards.weights))
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

    def extra_state(self) -> dict[str, Any]:
        """The trainer's running state besides weights, optimizer, KL controller, sampler and RNGs (checkpoints)."""
        best = self.best and {"iteration": self.best.iteration, "metric": self.best.metric, "value": self.best.value}
        return {"rm_offset": self.rm_offset,
                "reward_moments": self.reward_moments.state_dict() if self.reward_moments else None, "best": best}

    def load_extra_state(self, state: dict[str, Any], best_state: dict[str, torch.Tensor] | None = None) -> None:
        """Restore `extra_state`; `best_state` holds the best policy's weights when a best was recorded."""
        self._set_rm_offset(state["rm_offset"])
        if self.reward_moments is not None:
            self.reward_moments.load_state_dict(state["reward_moments"])
        best = state.get("best")
        self.best = BestPolicy(**best, state=best_state or {}) if best else None

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
        """One whole iteration, its phases called directly (`rlhf_lib.ppo.loop.run_iteration`)."""
        from rlhf_lib.ppo.loop import run_iteration

        return run_iteration(self)
