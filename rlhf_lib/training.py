"""Pieces shared by the supervised stages (SFT, reward model): seeding, optimizer with a linear schedule, batching,
and how a global batch is split over the training processes.

Global-batch semantics are those of one process. Every process draws the same seeded global batch and keeps its
contiguous slice (`shard`); each turns its local mean into its share of the global mean (`global_share`), so that
the gradient, which DDP averages over processes, is exactly the gradient of the one-process loss. The printed loss
and statistics are pooled over processes the same way. With one process every helper is the identity.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.events import Sink, metrics_log
from rlhf_lib.models import set_checkpointing

T = TypeVar("T")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def adamw_with_linear_schedule(
    params, lr: float, weight_decay: float, total_steps: int, warmup_frac: float = 0.05, eps: float = 1e-8
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with a linear warm-up over `warmup_frac` of the steps, then linear decay to 0.

    Fused (one kernel per parameter tensor) where every parameter is a float tensor on the CPU or a GPU: on the CPU
    torch's default is a per-tensor Python loop, a large share of a small model's step.
    """
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps, fused=fused or None)
    warm = max(1, math.ceil(total_steps * warmup_frac))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total_steps - step) / max(1, total_steps - warm))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def shuffled_batches(items: Sequence[T], batch_size: int, epochs: int, seed: int) -> Iterator[tuple[int, list[T]]]:
    """Yield (epoch, batch) over `epochs` passes, each pass in a fresh seeded order; the last batch may be short."""
    rng = random.Random(seed)
    for epoch in range(epochs):
        order = list(range(len(items)))
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            yield epoch, [items[j] for j in order[i : i + batch_size]]


def n_batches(n_items: int, batch_size: int, epochs: int, max_steps: int | None = None) -> int:
    """Optimizer steps of `epochs` passes over `n_items` in batches of `batch_size`, at most `max_steps`.

    >>> n_batches(10, 4, 2), n_batches(10, 4, 2, max_steps=5)
    (6, 5)
    """
    total = epochs * math.ceil(n_items / batch_size)
    return total if max_steps is None else min(total, max_steps)


def shard(batch: Sequence[T], rank: int, world: int) -> tuple[list[T], bool]:
    """Process `rank`'s contiguous slice of the global batch: ceil(B / world) items, the last slice shorter.

    A process left with nothing (the last batch of an epoch may hold fewer items than processes) gets the
    batch's first item with `real=False`: it still runs forward and backward, which DDP needs, but its share of
    the loss is 0. Example: B=5, world=2 -> items [0:3] and [3:5].
    """
    k = math.ceil(len(batch) / world)
    local = list(batch[rank * k : (rank + 1) * k])
    return (local, True) if local else ([batch[0]], False)


def share_factor(count: float, total: float, world: int) -> float:
    """W * n_r / N: what a process's local mean over n_r of the N items is multiplied by, so that the average
    over the W processes (DDP averages gradients) is the mean over all N items."""
    return count * world / total


def global_share(group: ProcessGroup, local_mean: torch.Tensor, count: float, anchor: torch.Tensor
                 ) -> tuple[torch.Tensor, float]:
    """This process's part of the global mean, scaled for DDP's averaging of gradients.

    The global mean over N = sum_r n_r items is sum_r n_r * m_r / N. DDP averages gradients over W processes, so
    each process returns W * n_r * m_r / N: the average of these is the global mean. `anchor` (any tensor of the
    forward pass, e.g. the logits) stands in when n_r = 0, so that every parameter still gets a (zero) gradient.
    Returns (share, N).
    """
    (total,) = group.sum([count])
    if group.world == 1:
        return local_mean, total
    if count == 0:
        return anchor.sum() * 0.0, total
    return local_mean * share_factor(count, total, group.world), total


def weighted_mean(group: ProcessGroup, stats: dict[str, float], weight: float) -> dict[str, float]:
    """Weighted mean of per-process statistics, each process weighing `weight` (e.g. its pair count)."""
    if group.world == 1:
        return dict(stats)
    keys = sorted(stats)
    sums = group.sum([stats[k] * weight for k in keys] + [weight])
    return {k: s / max(sums[-1], 1e-12) for k, s in zip(keys, sums[:-1])}


class SupervisedRun:
    """A model and optimizer prepared for the group, stepped with one process's numbers."""

    def __init__(self, group: ProcessGroup, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 gradient_checkpointing: bool = False):
        self.group, self.gradient_checkpointing = group, gradient_checkpointing
        if gradient_checkpointing:
            try:
                set_checkpointing(model, True)
            except ValueError as e:
                raise ValueError(f"resources.gradient_checkpointing: {e}") from None
        ds = getattr(group.acc.state, "deepspeed_plugin", None)
        if ds is not None:  # no DataLoader to infer it from; DeepSpeed only uses it for its own bookkeeping
            ds.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
        # The LR scheduler stays ours, stepped once per global step (Accelerate's wrapper would step it per process).
        self.model, self.optimizer = group.prepare(model, optimizer)

    def step(self, loss: torch.Tensor, scheduler, max_norm: float, what: str, step: int) -> tuple[float, float]:
        """Backward, global-norm clip, optimizer and scheduler step. Returns (global loss, grad norm).

        The loss is checked on its value pooled over processes, so every process refuses a non-finite loss
        together (a lone process raising would leave the others waiting in the next all-reduce).
        """
        (value,) = self.group.sum([float(loss.detach())])
        value /= self.group.world
        if not math.isfinite(value):
            raise FloatingPointError(f"{what} loss is {value} at step {step}")
        self.optimizer.zero_grad(set_to_none=True)
        self.group.backward(loss)
        grad_norm = self.group.acc.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return value, float(grad_norm) if grad_norm is not None else math.nan

    def finish(self) -> torch.nn.Module:
        """After training: the unwrapped model in eval mode, on the device it trained on (the stage scores its
        held-out data there)."""
        inner = self.group.unwrap(self.model)
        inner.eval()
        if self.gradient_checkpointing:
            set_checkpointing(inner, False)
        return inner


def run_launched(train, load, job: dict[str, Any], workdir: Path, sink: Sink) -> None:
    """One process of a supervised stage under `accelerate launch`: the starting model and tokenizer are in
    `workdir/init`, the examples and config in `job`; the main process reports metrics to `sink`, then writes the
    trained weights (gathered from every shard) to `workdir/out` and the final metrics to `workdir/final.json`.
    `train` is the stage's loop (`train_sft`, `train_reward_model`), `load(path, tokenizer)` its model loader."""
    from rlhf_lib.models import load_tokenizer

    tokenizer = load_tokenizer(workdir / "init")
    model = load(workdir / "init", tokenizer)
    group = ProcessGroup(job["mixed_precision"], job.get("device", "auto"))
    log = metrics_log(sink) if group.is_main else None
    final, prepared = train(model, tokenizer, job["examples"], job["config"], log, group, job["gradient_checkpointing"])
    state = group.full_state_dict(prepared)  # every process takes part in gathering the shards
    if group.is_main:
        group.unwrap(prepared).save_pretrained(workdir / "out", state_dict=state, safe_serialization=True)
        (workdir / "final.json").write_text(json.dumps(final))
    group.barrier()
    group.close()
