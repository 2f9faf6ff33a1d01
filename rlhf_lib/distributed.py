"""The supervised stages' process group, through Hugging Face Accelerate: one process, or many under
`accelerate launch` (DDP, FSDP or DeepSpeed ZeRO, chosen by the Accelerate config file).

Global-batch semantics are those of one process. Every process draws the same seeded global batch and keeps its
contiguous slice (`shard`); each turns its local mean into its share of the global mean (`global_share`), so
that the gradient, which DDP averages over processes, is exactly the gradient of the one-process loss. The
printed loss and statistics are pooled over processes the same way. With one process every helper is the
identity and the numbers are those of plain PyTorch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator

T = TypeVar("T")
MIXED_PRECISION = ("no", "bf16", "fp16")


def launched() -> bool:
    """Whether this process was started by a launcher (torchrun / `accelerate launch`) as one of a group."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "LOCAL_RANK" in os.environ


def make_accelerator(mixed_precision: str = "no", cpu: bool = False) -> Accelerator:
    """An `Accelerator` on the GPU where there is one, else CPU processes joined by gloo; `cpu=True`: CPU processes
    (gloo) even where there is a GPU.

    In a process that is not part of a launched group, Accelerate's process-wide state is reset first, so one
    Python process (a test session, a notebook) can train one stage in fp32 and the next in bf16.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"resources.mixed_precision must be one of {MIXED_PRECISION}, got {mixed_precision!r}")
    cuda = torch.cuda.is_available() and not cpu
    if mixed_precision == "fp16" and not cuda:
        raise ValueError("resources.mixed_precision=fp16 needs a CUDA GPU (loss scaling); use bf16 or no on CPU")
    if not launched():
        AcceleratorState._reset_state(reset_partial_state=True)
    # `cpu=True` without a GPU: a torchrun-launched group then joins over gloo (Accelerate's own multi-CPU
    # launcher needs MPI), and a single process stays on the CPU.
    return Accelerator(mixed_precision=mixed_precision, cpu=not cuda)


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


class Distributed:
    """What the training loops ask of the process group. Build one per training run."""

    def __init__(self, mixed_precision: str = "no", gradient_checkpointing: bool = False):
        self.acc = make_accelerator(mixed_precision)
        self.gradient_checkpointing = gradient_checkpointing
        self.model: torch.nn.Module | None = None

    @property
    def rank(self) -> int:
        return self.acc.process_index

    @property
    def world(self) -> int:
        return self.acc.num_processes

    @property
    def is_main(self) -> bool:
        return self.acc.is_main_process

    @property
    def device(self) -> torch.device:
        return self.acc.device

    def shard(self, batch: Sequence[T]) -> tuple[list[T], bool]:
        return shard(batch, self.rank, self.world)

    def sum(self, values: Sequence[float]) -> list[float]:
        """Sum of each value over processes (one all-reduce); the values themselves with one process."""
        if self.world == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        return self.acc.reduce(t, reduction="sum").tolist()

    def global_share(self, local_mean: torch.Tensor, count: float, anchor: torch.Tensor) -> tuple[torch.Tensor, float]:
        """This process's part of the global mean, scaled for DDP's averaging of gradients.

        The global mean over N = sum_r n_r items is sum_r n_r * m_r / N. DDP averages gradients over W
        processes, so each process returns W * n_r * m_r / N: the average of these is the global mean.
        `anchor` (any tensor of the forward pass, e.g. the logits) stands in when n_r = 0, so that every
        parameter still gets a (zero) gradient. Returns (share, N).
        """
        (total,) = self.sum([count])
        if self.world == 1:
            return local_mean, total
        if count == 0:
            return anchor.sum() * 0.0, total
        return local_mean * share_factor(count, total, self.world), total

    def pooled(self, stats: dict[str, float], weight: float) -> dict[str, float]:
        """Weighted mean of per-process statistics, each process weighing `weight` (e.g. its pair count)."""
        if self.world == 1:
            return dict(stats)
        keys = sorted(stats)
        sums = self.sum([stats[k] * weight for k in keys] + [weight])
        return {k: s / max(sums[-1], 1e-12) for k, s in zip(keys, sums[:-1])}

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """Wrap model and optimizer (DDP / FSDP / DeepSpeed per the launch config); the LR scheduler stays ours,
        stepped once per global step (Accelerate's wrapper would step it once per process)."""
        if self.gradient_checkpointing:
            if not getattr(model, "supports_gradient_checkpointing", False):
                raise ValueError(f"resources.gradient_checkpointing: {type(model).__name__} does not support it")
            # Non-reentrant checkpointing is the variant that works under DDP (no "marked ready twice").
            # transformers 5 renamed it activation checkpointing; 4.x has only the old name.
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable({"use_reentrant": False})
        ds = getattr(self.acc.state, "deepspeed_plugin", None)
        if ds is not None:  # no DataLoader to infer it from; DeepSpeed only uses it for its own bookkeeping
            ds.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
        self.model, optimizer = self.acc.prepare(model, optimizer)
        return self.model, optimizer

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}

    def step(self, loss: torch.Tensor, optimizer, scheduler, max_norm: float, what: str, step: int) -> tuple[float, float]:
        """Backward, global-norm clip, optimizer and scheduler step. Returns (global loss, grad norm).

        The loss is checked on its value pooled over processes, so every process refuses a non-finite loss
        together (a lone process raising would leave the others waiting in the next all-reduce).
        """
        (value,) = self.sum([float(loss.detach())])
        value /= self.world
        if not math.isfinite(value):
            raise FloatingPointError(f"{what} loss is {value} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        self.acc.backward(loss)
        grad_norm = self.acc.clip_grad_norm_(self.model.parameters(), max_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return value, float(grad_norm) if grad_norm is not None else math.nan

    def finish(self) -> None:
        """After training: eval mode, and with one process the model back on the CPU where the stage goes on."""
        inner = self.unwrapped()
        inner.eval()
        if self.gradient_checkpointing:
            (getattr(inner, "activation_checkpointing_disable", None) or inner.gradient_checkpointing_disable)()
        if self.world == 1:
            inner.to("cpu")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole prepared model's weights, gathered from every shard (FSDP, ZeRO-3). Every process must call
        it; the main process gets the full dict."""
        return self.acc.get_state_dict(self.model)

    def unwrapped(self) -> torch.nn.Module:
        """The model without its DDP/FSDP wrapper or mixed-precision forward: the object that was prepared."""
        return self.acc.unwrap_model(self.model, keep_fp32_wrapper=False)
