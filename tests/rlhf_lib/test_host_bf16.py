"""bf16 on a CPU that emulates it: read from /proc/cpuinfo, said once at config load, naming the keys to change."""

from __future__ import annotations

import warnings

import pytest

from flows.settings import HostPrecisionWarning, load_config
from rlhf_lib.host_bf16 import bf16_advice, native_bf16_in

X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
X86_BF16 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
X86_AMX = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
ARM = "Features\t: fp asimd evtstrm aes bf16 i8mm\n"
ARM_OLD = "Features\t: fp asimd evtstrm aes\n"


@pytest.mark.parametrize("text, machine, want", [
    (X86_AVX2, "x86_64", False), (X86_BF16, "x86_64", True), (X86_AMX, "x86_64", True), (ARM, "aarch64", True),
    (ARM_OLD, "aarch64", False), (X86_BF16, "riscv64", None), ("processor\t: 0\n", "x86_64", None),
    ("", "x86_64", None),
])
def test_native_bf16_is_read_from_the_flags(text, machine, want):
    assert native_bf16_in(text, machine) is want


def test_the_advice_names_each_bf16_key_and_only_on_an_emulating_cpu():
    cfg = load_config("micro", None, ["resources.mixed_precision=bf16", "resources.frozen_dtype=bfloat16"])
    (msg,) = bf16_advice(cfg, on_cpu=True, native=False)
    assert msg.startswith("resources.mixed_precision=bf16, resources.frozen_dtype=bfloat16 on a CPU without bf16")
    assert "resources.mixed_precision=no" in msg
    assert bf16_advice(cfg, on_cpu=True, native=True) == []  # avx512_bf16 / amx: bf16 is the fast path
    assert bf16_advice(cfg, on_cpu=True, native=None) == []  # unknown CPU: no guess
    assert bf16_advice(cfg, on_cpu=False, native=False) == []  # the stages run on a GPU
    assert bf16_advice(load_config("micro"), on_cpu=True, native=False) == []  # float32
    (msg,) = bf16_advice(load_config("micro", None, ["model.dtype=bfloat16"]), on_cpu=True, native=False)
    assert msg.startswith("model.dtype=bfloat16 on a CPU")


def test_load_config_warns_on_this_host_only_when_it_emulates_bf16(monkeypatch):
    import rlhf_lib.host_bf16 as host

    for native, expected in ((False, 1), (True, 0)):
        monkeypatch.setattr(host, "native_bf16", lambda native=native: native)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            load_config("micro", None, ["resources.mixed_precision=bf16", "resources.device=cpu"])
        assert sum(w.category is HostPrecisionWarning for w in got) == expected
