"""The training processes of a stage: one, or W under `accelerate launch` / torchrun, through Hugging Face Accelerate
(DDP, FSDP or DeepSpeed ZeRO, chosen by the Accelerate config file).

`ProcessGroup` is the one API the loops ask of them: rank, world size, sum, max, gather, broadcast, barrier and
prepare, and this process's rows of a batch (`local_rows`, `row_shard`). With one process every collective is the
identity and every process's rows are all the rows, so the numbers are those of plain PyTorch. The rest of how a loop
splits its work is the loop's own: the supervised stages' helpers are in `rlhf_lib.training`, PPO's rollout
gathering and gradient shares in `rlhf_lib.ppo.sharding`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from accelerate import Accelerator

MIXED_PRECISION = ("no", "bf16", "fp16")
# Seconds a collective waits for the other processes before failing, set by the launcher of a multi-node stage
# (`resources.rdzv_timeout_s`): without it gloo waits 30 minutes and NCCL 10 for a node that died.
TIMEOUT_ENV = "RLHF_PROCESS_GROUP_TIMEOUT_S"
T = TypeVar("T")
# The groups closed in a launched process, kept until it exits (`ProcessGroup.close`).
_KEPT_UNTIL_EXIT: list[ProcessGroup] = []


def launched() -> bool:
    """Whether this process was started by a launcher (torchrun / `accelerate launch`) as one of a group."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "LOCAL_RANK" in os.environ


def make_accelerator(mixed_precision: str = "no", cpu: bool = False) -> Accelerator:
    """An `Accelerator` on the GPU where there is one (NCCL between launched processes), else CPU processes joined by
    gloo; `cpu=True`: CPU processes (gloo) even where there is a GPU.

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
    return Accelerator(mixed_precision=mixed_precision, cpu=not cuda, kwargs_handlers=_group_options())


def _group_options() -> list:
    """The process group's timeout from `TIMEOUT_ENV`, when the launcher set one (the backends' default otherwise)."""
    from accelerate.utils import InitProcessGroupKwargs

    if not (seconds := os.environ.get(TIMEOUT_ENV)):
        return []
    timeout = timedelta(seconds=float(seconds))
    default = InitProcessGroupKwargs().timeout
    # Accelerate passes on only the fields that differ from its defaults: a timeout equal to its NCCL default
    # would leave gloo at 30 minutes, so it is moved off it by a millisecond.
    return [InitProcessGroupKwargs(timeout=timeout + timedelta(milliseconds=1) if timeout == default else timeout)]


class ProcessGroup:
    """This process's place among the stage's training processes, on `device` (`resources.device`: auto, cpu,
    cuda, cuda:N; a launched process on a GPU takes cuda:LOCAL_RANK). Build one per training run.

    Accelerate is started only when something needs it (preparing a model, a launched group): one process that
    trains without preparing anything, such as PPO in the stage's own process, never imports it.
    """

    def __init__(self, mixed_precision: str = "no", device: str = "auto"):
        from rlhf_lib.devices import resolve_device

        if mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"resources.mixed_precision must be one of {MIXED_PRECISION}, got {mixed_precision!r}")
        self._device = resolve_device(device)
        self.cpu = self._device.type == "cpu"
        if mixed_precision == "fp16" and self.cpu:
            raise ValueError("resources.mixed_precision=fp16 needs a CUDA GPU (loss scaling); use bf16 or no on CPU")
        if self._device.index is not None and not launched():
            torch.cuda.set_device(self._device)  # Accelerate's single process uses the current CUDA device
        self.mixed_precision = mixed_precision
        self._acc: Accelerator | None = make_accelerator(mixed_precision, self.cpu) if launched() else None

    @property
    def acc(self) -> Accelerator:
        if self._acc is None:
            self._acc = make_accelerator(self.mixed_precision, self.cpu)
        return self._acc

    @property
    def rank(self) -> int:
        return self._acc.process_index if self._acc else 0

    @property
    def world(self) -> int:
        return self._acc.num_processes if self._acc else 1

    @property
    def is_main(self) -> bool:
        return self._acc.is_main_process if self._acc else True

    @property
    def device(self) -> torch.device:
        if self._acc:
            return self._acc.device
        return self._device

    def local_rows(self, rows: T) -> T:
        """This process's contiguous slice of `rows` (a list or the rows of a tensor); len(rows) % W must be 0."""
        n, world = len(rows), self.world
        if world == 1:
            return rows
        if n % world:
            raise ValueError(f"{n} rows cannot be split evenly over {world} processes")
        k = n // world
        return rows[self.rank * k : (self.rank + 1) * k]

    def row_shard(self, total: int) -> RowShard | None:
        """This process's rows of a global batch of `total` rows, for sampling (`rlhf_lib.lm.generation.sample`):
        None with one process."""
        return None if self.world == 1 else RowShard(self.rank * (total // self.world), total, self)

    @property
    def shards_parameters(self) -> bool:
        """Whether each process holds a shard of the weights (FSDP, DeepSpeed ZeRO-3): every forward then gathers
        them, so every process must run the same forwards, and a forward whose output feeds the loss only through
        another forward's inputs may find its weights freed in the backward."""
        if self._acc is None:
            return False
        from accelerate.utils import DistributedType

        kind = self._acc.distributed_type
        plugin = getattr(self._acc.state, "deepspeed_plugin", None)
        return kind == DistributedType.FSDP or (kind == DistributedType.DEEPSPEED and plugin is not None
                                                and plugin.zero_stage == 3)

    def sum(self, values: Sequence[float]) -> list[float]:
        """Sum of each value over processes (one float64 all-reduce)."""
        if self.world == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def max(self, values: Sequence[int]) -> list[int]:
        """Maximum of each integer over processes."""
        if self.world == 1:
            return [int(v) for v in values]
        t = torch.tensor([int(v) for v in values], dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return t.tolist()

    def gather(self, x: Tensor) -> Tensor:
        """Every process's `x` (same shape everywhere) concatenated along dim 0 in rank order, on this device.
        Shape: (n, ...) -> (W * n, ...)."""
        if self.world == 1:
            return x
        x = x.to(self.device).contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        torch.distributed.all_gather(parts, x)
        return torch.cat(parts, 0)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's picklable `obj`, in rank order (small values only: it goes through pickle)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, flag: bool) -> bool:
        """The main process's `flag`, on every process (e.g. its decision to stop)."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        torch.distributed.broadcast(t, src=0)
        return bool(t.item())

    def barrier(self) -> None:
        """Wait for every process."""
        if self.world > 1:
            self.acc.wait_for_everyone()

    def prepare(self, *objects: Any) -> Any:
        """Wrap models and optimizers for the group (DDP / FSDP / DeepSpeed per the launch config; the device and
        mixed-precision forward with one process). Returns them in the same order, one object unpacked."""
        return self.acc.prepare(*objects)

    def backward(self, loss: Tensor) -> None:
        self.acc.backward(loss)

    def no_sync(self, modules: Sequence[torch.nn.Module | None], skip: bool = True):
        """Around a micro-batch's forward and backward: with `skip`, gradients only accumulate locally (DDP
        all-reduces them with the last micro-batch of the step)."""
        stack = contextlib.ExitStack()
        if skip and self.world > 1:
            for m in modules:
                if m is not None:
                    stack.enter_context(self.acc.no_sync(m))
        return stack

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model without its DDP/FSDP wrapper or mixed-precision forward: the object that was prepared."""
        return self.acc.unwrap_model(model, keep_fp32_wrapper=False)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, Tensor]:
        """A prepared model's whole weights, gathered from every shard (FSDP, ZeRO-3). Every process must call it;
        the main process gets the full dict."""
        return self.acc.get_state_dict(model)

    def close(self) -> None:
        """The group's end. In a launched process the group, its Accelerator and the models it prepared stay referenced
        until the process exits without tearing anything down (`stages.launch.worker` ends with `os._exit`). Freeing
        a DDP model frees its gloo process group, whose destructor joins the group's worker threads while holding the
        GIL, while a worker thread may be waiting for the GIL to free a finished barrier: a deadlock after the results
        are written (torch 2.13)."""
        if self._acc is None:
            return
        if launched():
            _KEPT_UNTIL_EXIT.append(self)
            return
        self._acc.end_training()


@dataclass
class RowShard:
    """Rows [start, start + n) of a global batch of `total` rows, held by this process, for `sample`."""

    start: int
    total: int
    group: ProcessGroup

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
