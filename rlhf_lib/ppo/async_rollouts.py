"""One-step-off-policy rollouts (`ppo.async_rollouts.staleness` > 0): the rollout of iteration t + s is sampled by a
copy of the policy in its own thread while iteration t scores, computes advantages and updates.

The order of one iteration t (`PPOTrainer.step`):

    take(t)          wait for rollout t (sampled with the weights of iteration t - s, or of the start)
    submit(t + s)    copy the current weights (those before update t) and hand rollout t + s to the sampler
    score, gae, update of rollout t, overlapping rollout t + s's sampling

`submit` goes through the loop's `call`: its `submit` attribute when it has one (the PPO stage submits the rollout
as a Prefect task, before the update task runs), else a one-thread executor. Each rollout is a pure function of
its prompts (drawn from the trainer's prompt sampler at submit, in iteration order), the weights copied at submit
and its own generator (seeded by `ppo.seed` and the rollout's index): which thread runs it and when never changes
what it draws. A checkpoint after iteration t holds the rollouts t .. t + s - 1 already submitted (sampled by
older weights than the checkpoint's), so a resumed run takes the same rollouts as an uninterrupted one.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from rlhf_lib.lm.compiled import CompiledDecoder
from rlhf_lib.lm.generation import encode_prompts, sample
from rlhf_lib.ppo.shaping import truncate_after_eos
from rlhf_lib.ppo.types import Rollout

# The fields of a sampled rollout that a checkpoint keeps (tensors; the prompts and version go to state.json).
SAMPLED = ("query", "query_mask", "response", "response_mask", "logprobs", "behaviour_logprobs")
Submit = Callable[..., Any]  # submit(phase, fn, *args) -> a future with .result()


def rollout_seed(seed: int, index: int) -> int:
    """The seed of rollout `index`'s generator: a function of the run's seed and the index alone."""
    return seed * 1_000_003 + index + 1


class RolloutQueue:
    """The sampler of async rollouts: its own copy of the policy (weights loaded from the copy each rollout was
    submitted with), one rollout sampled at a time, the submitted rollouts by iteration index."""

    def __init__(self, trainer: Any):  # a `rlhf_lib.ppo.setup.PPOSetup` (which builds the queue: no import back)
        if trainer.group.world > 1:
            raise ValueError("ppo.async_rollouts.staleness > 0 runs in one process: set resources.num_processes=1 "
                             "or staleness 0")
        self.trainer, self.cfg = trainer, trainer.cfg
        self.staleness = trainer.cfg.async_rollouts.staleness
        self.model = copy.deepcopy(trainer.models.policy)  # the sampler's own weights (LoRA: with its adapters)
        self.model.requires_grad_(False)
        self.model.eval()
        self.decoder = CompiledDecoder() if self.cfg.rollout_engine == "compiled" else None
        self.lock = threading.Lock()  # one rollout samples at a time: the sampler's model holds one set of weights
        self.pending: dict[int, Future | Rollout] = {}
        self._executor: ThreadPoolExecutor | None = None

    # weights -----------------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, torch.Tensor]:
        """Copies of the policy's trained weights now (all of them; LoRA: the adapters)."""
        return {n: p.detach().clone() for n, p in self.trainer.models.policy.named_parameters() if p.requires_grad}

    # the sampler's side ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def sample(self, index: int, version: int, prompts: list[str], query: torch.Tensor, query_mask: torch.Tensor,
               weights: dict[str, torch.Tensor]) -> Rollout:
        """Rollout `index` sampled by the policy of `version` updates (its trained weights `weights`)."""
        c, tok = self.cfg, self.trainer.models.tokenizer
        with self.lock:
            t0 = time.perf_counter()
            params = dict(self.model.named_parameters())
            for name, w in weights.items():
                params[name].copy_(w)
            weights.clear()  # the copy is freed as soon as it is loaded
            generator = torch.Generator().manual_seed(rollout_seed(c.seed, index))
            with self.trainer.precision():
                response, response_mask, logprobs = sample(
                    self.model, query, query_mask, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, generator=generator,
                    stop_at_eos=c.stop_at_eos, decoder=self.decoder)
            if not c.stop_at_eos:
                response, response_mask, logprobs = truncate_after_eos(response, response_mask, logprobs,
                                                                       tok.eos_token_id, tok.pad_token_id)
            seconds = time.perf_counter() - t0
        return Rollout(query, query_mask, response, response_mask, logprobs, prompts=prompts,
                       behaviour_logprobs=logprobs.clone(), version=version, sample_seconds=seconds)

    # the trainer's side ----------------------------------------------------------------------------------------
    def submit(self, index: int, submit: Submit | None) -> None:
        """Draw rollout `index`'s prompts, copy the current weights and hand it to the sampler."""
        t, c = self.trainer, self.cfg
        k = 1 if c.has_critic else c.group_size
        prompts = [p for p in t.sampler.next(c.batch_size // k) for _ in range(k)]
        # Tokenised here, in the trainer's thread: a fast tokenizer is not safe to call from two threads at once.
        query, query_mask = (x.to(t.device) for x in encode_prompts(t.models.tokenizer, prompts, t.max_prompt_tokens))
        args = (index, t.iteration, prompts, query, query_mask, self.snapshot())
        if submit is None:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="rlhf-rollout")
            self.pending[index] = self._executor.submit(self.sample, *args)
        else:
            self.pending[index] = submit("rollout", self.sample, *args)

    def take(self, index: int, submit: Submit | None) -> Rollout:
        """Rollout `index`, waited for: first submitting those of `index` .. `index + staleness - 1` that are not
        (the run's start, or a resume from a checkpoint without them), then, once it is in hand, rollout
        `index + staleness` (while the iterations last): the one sampled during this iteration's update."""
        for i in range(index, min(index + self.staleness, self.cfg.iterations)):
            if i not in self.pending:
                self.submit(i, submit)
        ro = self._result(self.pending.pop(index))
        ahead = index + self.staleness
        if ahead < self.cfg.iterations and ahead not in self.pending:
            self.submit(ahead, submit)
        return ro

    @staticmethod
    def _result(item: Future | Rollout) -> Rollout:
        return item if isinstance(item, Rollout) else item.result()

    def wait(self) -> dict[int, Rollout]:
        """Every submitted rollout, sampled (a checkpoint saves them)."""
        self.pending = {i: self._result(item) for i, item in sorted(self.pending.items())}
        return dict(self.pending)

    def close(self) -> None:
        """Let the sampler finish what it runs and stop its thread (what is not taken is dropped)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self.pending.clear()

    # checkpoints -----------------------------------------------------------------------------------------------
    def state(self) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
        """The submitted rollouts as JSON (index, version, prompts) and tensors (`<index>.<field>`)."""
        rollouts = self.wait()
        meta = [{"index": i, "version": ro.version, "prompts": ro.prompts} for i, ro in rollouts.items()]
        tensors = {f"{i}.{name}": getattr(ro, name).detach().cpu().contiguous()
                   for i, ro in rollouts.items() for name in SAMPLED}
        return meta, tensors

    def check_state(self, meta: list[dict[str, Any]], tensors: dict[str, torch.Tensor], where: str) -> None:
        for entry in meta:
            missing = [f"{entry['index']}.{name}" for name in SAMPLED if f"{entry['index']}.{name}" not in tensors]
            if missing:
                raise ValueError(f"{where}: missing tensors {missing} of a submitted rollout")

    def load_state(self, meta: list[dict[str, Any]], tensors: dict[str, torch.Tensor]) -> None:
        """Restore `state` (checked by `check_state`): the rollouts are taken as they were sampled."""
        self.close()
        for entry in meta:
            i = int(entry["index"])
            fields = {name: tensors[f"{i}.{name}"].to(self.trainer.device) for name in SAMPLED}
            self.pending[i] = Rollout(**fields, prompts=list(entry["prompts"]), version=int(entry["version"]))
