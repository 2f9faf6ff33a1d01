"""What PPO holds and how it is set up: the four models placed on the device in their dtypes, LoRA, the reward
sources, the critic, the optimizer, the KL controller and the running statistics, with the helpers the phases call.
The phases themselves, one page, are `rlhf_lib.ppo.trainer.PPOTrainer`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.devices import autocast
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.envs.episodes import EpisodeRunner, Episodes
from rlhf_lib.lm.compiled import CompiledDecoder
from rlhf_lib.lm.generation import encode_prompts, sample
from rlhf_lib.lm.scoring import response_logprobs
from rlhf_lib.ppo.async_rollouts import RolloutQueue
from rlhf_lib.models import fit_length, freeze, set_checkpointing
from rlhf_lib.ppo.critic import Critic, disable_dropout
from rlhf_lib.ppo.kl import AdaptiveKLController, FixedKLController
from rlhf_lib.ppo.lora import adapters_off, add_lora, merged_copy
from rlhf_lib.ppo.ptx import PtxSampler
from rlhf_lib.ppo.sampler import PromptSampler
from rlhf_lib.ppo.shaping import RunningMoments, rm_offset_prompts
from rlhf_lib.ppo.sharding import check_sizes, prepare_models
from rlhf_lib.ppo.types import BestPolicy, PPOModels
from rlhf_lib.lm.vllm_engine import rollout_engine
from rlhf_lib.rewards.combine import RewardSet
from rlhf_lib.rewards.retokenize import RewardScorer

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel


class PPOSetup:
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
        self.score_seconds: dict[str, float] = {}  # each reward source's seconds in the last score phase
        self.device = self.group.device
        # The trained models keep their dtype (model.dtype, float32 by default); the frozen ones take frozen_dtype.
        for model in filter(None, (models.policy, models.value)):
            model.to(self.device)
        for model in filter(None, (models.ref, models.reward, *(j.model for j in models.judges.values()))):
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
        self.rewards = RewardSet(cfg.rewards, rm, models.tokenizer, columns, cfg.score_batch_size,
                                 judges=models.judges)
        # Multi-turn rollouts (docs/environments.md): one environment per row and episode, its observations in the
        # prompts' format.
        self.env = EpisodeRunner.build(cfg, models.tokenizer, prompts, columns)
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
        self.rm_scale = 1.0  # ppo.rm_unit_std: the SFT samples' score std, set with the offset
        # Demonstrations are cut to what the policy's position embeddings cover, as in SFT.
        self.ptx = (PtxSampler(ptx_examples, models.tokenizer, fit_length(ptx_max_length, models.policy),
                               cfg.ptx_batch_size, self.generator, self.device) if cfg.ptx_coef > 0 else None)
        self.iteration = self.refused_streak = 0
        self.best: BestPolicy | None = None  # ppo.keep=best: the best held-out evaluation so far
        # vLLM (GPU only) fails here, at stage start, on a machine without one.
        self.engine = rollout_engine(cfg, self.export_policy(), models.tokenizer)
        self.decoder = CompiledDecoder() if cfg.rollout_engine == "compiled" else None  # kept: each shape compiles once
        # ppo.async_rollouts: the sampler thread's copy of the policy and the rollouts in flight (None: synchronous).
        self.queue = RolloutQueue(self) if cfg.async_rollouts.staleness else None

    @torch.inference_mode()
    def _policy_logprobs(self, *rows: torch.Tensor) -> torch.Tensor:
        """The policy's log-probs of sampled rows (query, query_mask, response, response_mask) by the update's own
        forward, under the same autocast, `score_batch_size` rows at a time. Shape: (B, R)."""
        n, c = self.cfg.score_batch_size, self.cfg
        with self.precision():
            return torch.cat([response_logprobs(self.models.policy, *(t[i : i + n] for t in rows),
                                                temperature=c.temperature, chunk=c.logprob_chunk)[0]
                              for i in range(0, rows[0].shape[0], n)])

    def episodes(self, model: PreTrainedModel, prompts: Sequence[str], query: torch.Tensor, query_mask: torch.Tensor,
                 generator: torch.Generator) -> Episodes:
        """One multi-turn episode per row (ppo.environment), each policy turn sampled from `model` at the
        temperature. Shapes: query, query_mask (B, P) -> Episodes of (B, R)."""
        return self.env(model, prompts, query, query_mask, self.cfg.temperature, generator)

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

    def close(self) -> None:
        """Stop the vLLM engine and the sampler thread of async rollouts, if any."""
        if self.engine is not None:
            self.engine.close()
        if self.queue is not None:
            self.queue.close()

    def sync_engine(self) -> None:
        """Load the policy's current weights into the vLLM engine (after each update and after a resume)."""
        if self.engine is not None:
            self.engine.sync_weights(self.export_policy())

    def export_policy(self) -> PreTrainedModel:
        """The trained policy as a plain transformers model (LoRA adapters merged in) for saving and registering."""
        return merged_copy(self.peft) if self.peft is not None else self.models.policy

    def _set_rm_offset(self, offset: float | None, scale: float = 1.0) -> None:
        self.rm_offset, self.rm_scale = offset, scale
        # A value model copied from the RM predicts raw scores; one built from SFT (or for an RM that reads other
        # token ids) starts at 0 and needs no shift. With rm_unit_std the copied critic is shifted, not scaled: its
        # shifted predictions start near 0 (a tiny raw spread) and it learns the scale, as a critic from SFT does.
        if (self.critic.kind == "separate" and self.cfg.value_init == "reward" and self.models.reward is not None
                and self.models.reward_tokenizer is None):
            self.critic.offset = offset or 0.0

    def _rm_offset(self) -> tuple[float, float]:
        """RM normalisation (N+ implementation details, after Ziegler et al. 2019): the mean summed score of
        `rm_offset_samples` responses of the SFT policy (= the frozen reference) to training prompts, and the scale:
        their scores' standard deviation (population) with `rm_unit_std`, else 1. Its own RNGs, so the training
        stream is the same with the offset on or off."""
        c, tok = self.cfg, self.models.tokenizer
        prompts, gen = rm_offset_prompts(self.sampler.prompts, c.rm_offset_samples, c.seed)
        total = square = 0.0
        for i in range(0, len(prompts), c.batch_size):
            chunk = prompts[i : i + c.batch_size]
            local = self.group.local_rows(chunk)
            query, query_mask = (t.to(self.device) for t in encode_prompts(tok, local, self.max_prompt_tokens))
            with adapters_off(self.peft), self.precision():
                if self.env is not None:
                    ep = self.episodes(self.reference, local, query, query_mask, gen)
                    response, response_mask = ep.response, ep.response_mask
                else:
                    response, response_mask, _ = sample(
                        self.reference, query, query_mask, max_new_tokens=c.max_new_tokens,
                        temperature=c.temperature, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                        generator=gen, shard=self.group.row_shard(len(chunk)),
                    )
            with self.precision():
                extra = {} if self.env is None else {"env_returns": ep.returns,
                                                     "completions": [t[-1].text for t in ep.turns]}
                got = self.rewards(local, query, query_mask, response, response_mask, **extra).total.double()
                total, square = total + float(got.sum()), square + float((got * got).sum())
        total, square = self.group.sum([total, square])
        mean = total / len(prompts)
        if not c.rm_unit_std:
            return mean, 1.0
        std = max(square / len(prompts) - mean * mean, 0.0) ** 0.5
        if std < 1e-12:
            raise ValueError(f"ppo.rm_unit_std: the {len(prompts)} SFT samples all scored {mean:.6g}: no spread to "
                             "divide by (set ppo.rm_unit_std=false or score more samples, ppo.rm_offset_samples)")
        return mean, std

    def extra_state(self) -> dict[str, Any]:
        """The trainer's running state besides weights, optimizer, KL controller, sampler and RNGs (checkpoints)."""
        best = self.best and {"iteration": self.best.iteration, "metric": self.best.metric, "value": self.best.value}
        return {"rm_offset": self.rm_offset, "rm_scale": self.rm_scale,
                "reward_moments": self.reward_moments.state_dict() if self.reward_moments else None, "best": best}

    def load_extra_state(self, state: dict[str, Any], best_state: dict[str, torch.Tensor] | None = None) -> None:
        """Restore `extra_state`; `best_state` holds the best policy's weights when a best was recorded."""
        self._set_rm_offset(state["rm_offset"], state.get("rm_scale", 1.0))  # checkpoints before rm_unit_std: 1
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
