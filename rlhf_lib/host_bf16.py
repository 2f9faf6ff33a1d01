"""Whether this CPU computes bfloat16 natively, and the advice for a config that asks for bf16 on one that does not.

On a CPU without bf16 instructions (x86 without avx512_bf16 or amx_bf16; ARM without the bf16 feature) torch runs
bf16 matmuls emulated: 1 GFLOP/s against 62 GFLOP/s in float32 on a 2-core AVX2 AMD EPYC (measured 2026-12-06,
benchmarks/RESULTS.md), so a preset tuned for a bf16 CPU (smollm2-hh: 6.7 s a step against 13.3 s in float32 there)
would run tens of times slower than float32 here.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlhf_lib.config import PipelineConfig

X86_BF16 = ("avx512_bf16", "amx_bf16")


def native_bf16_in(cpuinfo: str, machine: str) -> bool | None:
    """From the text of /proc/cpuinfo and `platform.machine()`: True or False, or None when neither says."""
    words: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words.update(value.split())
    if not words:
        return None
    if machine.lower() in ("x86_64", "amd64", "i686", "i386"):
        return any(f in words for f in X86_BF16)
    if machine.lower() in ("aarch64", "arm64"):
        return "bf16" in words
    return None


@functools.lru_cache(maxsize=1)
def native_bf16() -> bool | None:
    """This host's answer (Linux: /proc/cpuinfo); None where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return native_bf16_in(text, platform.machine())


def bf16_keys(cfg: PipelineConfig) -> list[str]:
    """The keys that put bf16 matmuls on the stages' device."""
    keys = []
    if cfg.resources.mixed_precision == "bf16":
        keys.append("resources.mixed_precision=bf16")
    if cfg.resources.frozen_dtype == "bfloat16":
        keys.append("resources.frozen_dtype=bfloat16")
    if cfg.model.dtype == "bfloat16":
        keys.append("model.dtype=bfloat16")
    return keys


def bf16_advice(cfg: PipelineConfig, on_cpu: bool, native: bool | None) -> list[str]:
    """One message when the stages run on a CPU that lacks bf16 instructions (`native` False) and the config asks
    for bf16 matmuls; [] otherwise (a GPU, a bf16 CPU, an unknown CPU, or float32)."""
    keys = bf16_keys(cfg)
    if not on_cpu or native is not False or not keys:
        return []
    return [f"{', '.join(keys)} on a CPU without bf16 instructions (no {' or '.join(X86_BF16)} in /proc/cpuinfo): "
            "torch emulates its bf16 matmuls, tens of times slower than float32 (1 against 62 GFLOP/s on a 2-core "
            "AVX2 EPYC). Set resources.mixed_precision=no, resources.frozen_dtype=float32 and model.dtype=float32 "
            "on this host"]
