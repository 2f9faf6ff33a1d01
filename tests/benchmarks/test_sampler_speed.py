"""benchmarks/sampler_speed.py and gpu_sampler.sh without a GPU: the GPU script stops at once and says why; the
benchmark runs on a tiny GGUF on the CPU (slow set) and both engines draw the same tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would run")
def test_the_gpu_script_stops_at_once_without_cuda():
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_sampler.sh")], capture_output=True, text=True,
                          timeout=120, check=False, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert proc.returncode == 3 and "no CUDA GPU" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.slow
def test_both_engines_on_a_tiny_gguf(tmp_path):
    from tests.rlhf_lib.gguf_writer import write_tiny_llama_gguf

    gguf = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(gguf)
    out = tmp_path / "speed.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sampler_speed.py"), "--model", str(gguf), "--batch", "2",
           "--new-tokens", "4", "--repeats", "1", "--out", str(out)]
    env = {"PATH": "/usr/bin:/bin", "RLHF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["same_tokens"] and got["compiles"] == 1 and got["compile_s"] > 0
    assert got["eager"]["tokens_per_s"] > 0 and got["compiled"]["tokens_per_s"] > 0
