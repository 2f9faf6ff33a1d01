"""Where the models run and in which precision: `resources.device`, `model.dtype`, `resources.frozen_dtype` and
`resources.mixed_precision` turned into torch objects, once, for every stage."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from rlhf_lib.config.base import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceUnavailable(ConfigError):
    """The configured device does not exist on this machine; the message names the key and what is there. A config
    error: the commands check it before any stage runs (`cli.main.cmd_run`, the pipeline flow)."""


def resolve_device(name: str) -> torch.device:
    """`resources.device` on this machine: auto -> cuda when torch sees a GPU, else cpu; cuda and cuda:N must exist.

    With one process a bare `cuda` is the current device (cuda:0 unless CUDA_VISIBLE_DEVICES or
    `torch.cuda.set_device` says otherwise)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"resources.device={name}: torch {torch.__version__} sees no CUDA GPU here "
                                    f"(built with CUDA {torch.version.cuda}); use resources.device=auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"resources.device={name}: this machine has {torch.cuda.device_count()} CUDA "
                                    f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    elif device.type != "cpu":
        raise DeviceUnavailable(f"resources.device={name}: expected auto, cpu, cuda or cuda:N")
    return device


def weights_dtype(name: str) -> torch.dtype | str:
    """`model.dtype` / `resources.frozen_dtype` as `from_pretrained(dtype=...)` takes it ("auto" stays a string)."""
    return "auto" if name == "auto" else DTYPES[name]


def autocast(device: torch.device, mixed_precision: str) -> Callable[[], AbstractContextManager]:
    """A factory of the autocast context of `resources.mixed_precision` on `device` (a no-op for "no").

    Forward passes run inside it; backward passes outside (PyTorch's AMP recipe). Weights keep their dtype.
    """
    if mixed_precision == "no":
        return contextlib.nullcontext
    if mixed_precision == "fp16" and device.type != "cuda":
        raise ValueError("resources.mixed_precision=fp16 needs a CUDA GPU (loss scaling); use bf16 or no on CPU")
    dtype = AUTOCAST[mixed_precision]
    return lambda: torch.autocast(device.type, dtype=dtype)


def module_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))
