"""PPO in W processes under `accelerate launch` (DDP), with the numbers of one process.

Every process builds the same trainer from the same seed, so the prompt sampler and the trainer's generator step
identically everywhere. Per phase, with a global rollout of B rows:

  1. generate   process r samples its contiguous slice of the B prompts. Its random draws are its rows of the
                draws one process makes for the whole batch (`RowShard`), and every process runs the same number
                of token steps (until every row of every process is done), so the generator streams stay equal
                and the tokens are those of one process.
  2. score      reference log-probs, values and RM scores of the local rows: no communication.
     gather     the scored rows are all-gathered into the global rollout, queries left-padded and responses
                right-padded to the widest, which is exactly the rollout one process would hold. It is small next
                to the models: (B, P + R) ids and a few (B, R) floats.
  3., 4.        KL-shaped rewards, the KL controller, reward whitening, GAE or group advantages, advantage whitening
                and every logged statistic run on the global rollout, identically in every process: one-process code,
                so beta, the running moments and whitening are global by construction and GRPO/RLOO groups whole.
  5. update     the epoch's permutation comes from the shared generator; process r computes the r-th contiguous
                slice of each minibatch's rows, its loss scaled by W, so that DDP's average of gradients is the
                one-process token mean (see `share`). Statistics, the NaN guard and the early stop read sums over
                processes, so every process takes the same decisions.

`Solo` is the one-process group: every hook is the identity and the trainer runs its original code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn

from rlhf_lib.config import PPOConfig

if TYPE_CHECKING:
    from rlhf_lib.ppo.critic import Critic
    from rlhf_lib.ppo.types import Rollout

T = TypeVar("T")
# Rollout fields gathered after scoring, and what pads them: a query is left-padded, the rest right-padded.
_RESPONSE_FIELDS = ("response_mask", "logprobs", "ref_logprobs", "values")


def check_sizes(cfg: PPOConfig, world: int) -> None:
    """Refuse a PPO config that W processes cannot split evenly; errors name the keys. Nothing to check for W = 1."""
    if world == 1:
        return
    mb = cfg.batch_size // cfg.minibatches
    checks = [
        (mb % (world * cfg.gradient_accumulation_steps),
         (f"each minibatch (ppo.batch_size / ppo.minibatches = {mb} rows) is split over resources.num_processes "
          f"({world}), then into ppo.gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) micro-batches: "
          f"it must be divisible by {world * cfg.gradient_accumulation_steps}")),
        (cfg.rm_offset_samples % world,
         f"ppo.rm_offset_samples ({cfg.rm_offset_samples}) must be divisible by resources.num_processes ({world})"),
        (cfg.ptx_coef > 0 and cfg.ptx_batch_size % world,
         f"ppo.ptx_batch_size ({cfg.ptx_batch_size}) must be divisible by resources.num_processes ({world})"),
        (cfg.rollout_engine != "hf", "ppo.rollout_engine=vllm runs in one process only (resources.num_processes=1)"),
    ]
    for bad, message in checks:
        if bad:
            raise ValueError(message)


@dataclass
class RowShard:
    """Rows [start, start + n) of a global batch of `total` rows, held by this process, for `sample`."""

    start: int
    total: int
    group: Group

    def uniforms(self, steps: int, n: int, generator: torch.Generator | None) -> Tensor:
        """The uniforms of `sample`'s inverse-CDF draws for these n rows. Shape: (steps, n).

        They are exactly those of sampling the whole batch in one process: drawing the (steps, total) block steps
        the generator as one process does, and these rows get their columns of it.
        """
        return torch.rand((steps, self.total), generator=generator)[:, self.start : self.start + n]

    def all_done(self, done: Tensor) -> bool:
        """Whether every row of every process is done: all processes run the same number of steps."""
        (alive,) = self.group.sum([float(not bool(done.all()))])
        return alive == 0


class Solo:
    """One process: every hook is the identity, so the trainer runs exactly its one-process code."""

    world, rank, is_main = 1, 0, True

    def local(self, rows: T) -> T:
        return rows

    def row_shard(self, total: int) -> RowShard | None:
        return None

    def sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def gather(self, ro: Rollout, pad_id: int) -> None:
        """Make `ro` the global rollout (in place): it already is."""

    def prepare(self, policy: nn.Module, critic: Critic, optimizer: torch.optim.Optimizer, frozen: Sequence[Any]):
        """The policy module the update calls, and the optimizer: the plain ones."""
        return policy, optimizer

    def accumulating(self, skip_sync: bool):
        return contextlib.nullcontext()

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def pooled(self, loss: float, stats: dict[str, float]) -> tuple[float, dict[str, float]]:
        return loss, stats

    def agree(self, flag: bool) -> bool:
        """The main process's decision, on every process."""
        return flag

    def barrier(self) -> None:
        """Wait for every process."""


class Group(Solo):
    """W processes under `accelerate launch`, joined by Accelerate's process group. CPU processes and gloo, also on
    a machine with GPUs: PPO's trainer runs on the CPU in one process too (its sampling loop is not device-aware)."""

    def __init__(self):
        from rlhf_lib.distributed import make_accelerator

        self.acc = make_accelerator("no", cpu=True)
        self.world, self.rank, self.is_main = self.acc.num_processes, self.acc.process_index, self.acc.is_main_process
        self.device = self.acc.device
        self.modules: list[nn.Module] = []

    def local(self, rows: T) -> T:
        """This process's contiguous slice of `rows` (a list or the rows of a tensor); len(rows) % W must be 0."""
        n = len(rows)
        if n % self.world:
            raise ValueError(f"{n} rows cannot be split evenly over {self.world} processes")
        k = n // self.world
        return rows[self.rank * k : (self.rank + 1) * k]

    def row_shard(self, total: int) -> RowShard:
        return RowShard(self.rank * (total // self.world), total, self)

    def sum(self, values: Sequence[float]) -> list[float]:
        """Sum over processes of each value (one float64 all-reduce)."""
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def _max(self, values: Sequence[int]) -> list[int]:
        t = torch.tensor(list(values), dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return t.tolist()

    def _cat(self, x: Tensor, width: int, pad: float, left: bool = False) -> Tensor:
        """All processes' rows of `x` (B/W, w) padded to `width` columns, in rank order. Shape: (B, width)."""
        fill = torch.full((x.shape[0], width - x.shape[1]), pad, dtype=x.dtype, device=self.device)
        x = torch.cat([fill, x.to(self.device)] if left else [x.to(self.device), fill], 1).contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        torch.distributed.all_gather(parts, x)
        return torch.cat(parts, 0)

    def gather(self, ro: Rollout, pad_id: int) -> None:
        """Replace the local rows of a scored rollout by the global rollout (in place), padded as one process pads:
        queries with PAD on the left (mask 0), responses with PAD on the right (mask, log-probs and values 0)."""
        p, r = self._max([ro.query.shape[1], ro.response.shape[1]])
        ro.query, ro.query_mask = self._cat(ro.query, p, pad_id, left=True), self._cat(ro.query_mask, p, 0, left=True)
        ro.response = self._cat(ro.response, r, pad_id)
        for name in _RESPONSE_FIELDS:
            if getattr(ro, name) is not None:
                setattr(ro, name, self._cat(getattr(ro, name), r, 0))
        ro.raw_scores = self._cat(ro.raw_scores.unsqueeze(1), 1, 0).squeeze(1)
        prompts: list[list[str]] = [[] for _ in range(self.world)]
        torch.distributed.all_gather_object(prompts, ro.prompts)
        ro.prompts = [p for part in prompts for p in part]

    def prepare(self, policy: nn.Module, critic: Critic, optimizer: torch.optim.Optimizer, frozen: Sequence[Any]):
        """Wrap the trained modules in DDP (the policy, and the critic's forward: see `Critic.trainable_forward`);
        the frozen reference and reward model stay plain full copies on this process's device. Sets
        `critic.wrapped`; returns the wrapped policy and the prepared optimizer."""
        for model in frozen:
            if model is not None:
                model.to(self.device)
        net = critic.trainable_forward()
        if net is None:
            policy, optimizer = self.acc.prepare(policy, optimizer)
        else:
            policy, critic.wrapped, optimizer = self.acc.prepare(policy, net, optimizer)
        self.modules = [m for m in (policy, critic.wrapped) if m is not None]
        return policy, optimizer

    def accumulating(self, skip_sync: bool):
        """Around a micro-batch's forward and backward: with `skip_sync`, gradients only accumulate locally (DDP
        all-reduces them with the minibatch's last micro-batch)."""
        stack = contextlib.ExitStack()
        if skip_sync:
            for m in self.modules:
                stack.enter_context(self.acc.no_sync(m))
        return stack

    def backward(self, loss: Tensor) -> None:
        """Backward of this process's share of a global mean: times W, since DDP averages gradients over W."""
        self.acc.backward(loss * self.world)

    def pooled(self, loss: float, stats: dict[str, float]) -> tuple[float, dict[str, float]]:
        """Sums over processes of the minibatch loss and statistics (each process holds its share of them)."""
        keys = sorted(stats)
        sums = self.sum([loss] + [stats[k] for k in keys])
        return sums[0], dict(zip(keys, sums[1:]))

    def agree(self, flag: bool) -> bool:
        t = torch.tensor([float(flag)], device=self.device)
        torch.distributed.broadcast(t, src=0)
        return bool(t.item())

    def barrier(self) -> None:
        self.acc.wait_for_everyone()
