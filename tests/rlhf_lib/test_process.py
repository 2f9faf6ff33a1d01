"""Process-wide settings: threads and glibc's trim threshold."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlhf_lib.process import configure_process, return_freed_memory


def test_configure_process_sets_the_threads():
    before = torch.get_num_threads()
    try:
        configure_process(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_memory_goes_back_to_the_os():
    """32 MiB freed at the top of the heap (less than the trim threshold glibc has raised to 48 MiB) leave the RSS
    with the setting, and stay in it without. Run in fresh processes: the setting is process-wide."""
    script = """
import ctypes, os, sys
from rlhf_lib.process import return_freed_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
applied = return_freed_memory() if sys.argv[1] == "on" else False
libc.free(libc.malloc(24 << 20))  # an mmap-ed block: freeing it raises the mmap threshold to 24 MiB, trim to 48
blocks = [libc.malloc(1 << 20) for _ in range(32)]  # now on the heap
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
before = rss()
for b in reversed(blocks):
    libc.free(b)
print(applied, before - rss())
"""
    released = {}
    for mode in ("on", "off"):
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True,
                             env={"PATH": "", "PYTHONPATH": ":".join(sys.path)}).stdout.split()
        released[mode] = (out[0] == "True", int(out[1]))
    assert released["on"][0] and released["on"][1] >= 28
    assert released["off"][1] < 4


def test_the_users_malloc_setting_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    assert return_freed_memory() is False
