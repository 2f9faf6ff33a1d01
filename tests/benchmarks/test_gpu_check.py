"""benchmarks/gpu_check.sh and gpu_check.py without a GPU: the shell script stops at once and says why, every part
runs at tiny size on the CPU, and the metric comparison is checked by hand."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import compare, preflight

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would run")
def test_the_shell_script_stops_at_once_without_cuda(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=120, check=False, env={**ENV, "PYTHON": sys.executable, "OUT": str(tmp_path)})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "gpu_check: INCOMPLETE: torch" in proc.stdout and "nothing to check on cuda" in proc.stdout
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "incomplete"


def test_preflight_names_what_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None if name in ("mlflow", "peft") else real(name))
    fatal, missing = preflight("cpu")
    assert fatal is None and missing == {"bench": ["peft"], "pipeline": ["mlflow"]}


def test_compare_checks_data_sft_and_rm_and_reports_the_rest():
    ref = {"sft": {"sft/loss": 2.0, "sft/steps": 3.0}, "reward": {"reward/heldout_accuracy": 0.625},
           "ppo": {"objective/kl": 0.1}}
    # sft/loss: |2.0015 - 2.0| = 1.5e-3 <= 1e-4 + 1e-3 * 2.0 = 2.1e-3, within. The accuracy flip (discrete) and the
    # PPO KL (sampled) are reported, not checked.
    got = {"sft": {"sft/loss": 2.0015, "sft/steps": 3.0}, "reward": {"reward/heldout_accuracy": 0.5},
           "ppo": {"objective/kl": 0.3}}
    out = compare("t", ref, got, "float32")
    assert out["status"] == "passed" and out["failures"] == []
    assert [r["metric"] for r in out["rows"] if r["checked"]] == ["sft/loss", "sft/steps"]
    # 2.003: 3e-3 > 2.1e-3, a failure naming the metric.
    got["sft"]["sft/loss"] = 2.003
    assert compare("t", ref, got, "float32")["failures"] == ["sft/loss"]
    assert compare("t", ref, {"error": "exit 1"}, "float32")["status"] == "failed"


@pytest.mark.slow
def test_every_part_runs_at_tiny_size_on_the_cpu(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--dtype", "float32",
           "--tiny", "--set", "torch_threads=1"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600,
                          env={**ENV, "OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "passed"
    # (a) the same command on the CPU twice: every metric agrees, sampled ones too.
    assert report["pipeline"]["status"] == "passed" and all(r["ok"] for r in report["pipeline"]["rows"])
    assert {r["stage"] for r in report["pipeline"]["rows"]} == {"data", "sft", "reward", "ppo", "eval"}
    assert report["bf16"]["status"] == "passed"
    assert report["bench"]["config"]["bench"]["device"] == "cpu" and "mfu_update" in report["bench"]
    assert report["memory"]["status"] in ("passed", "skipped") and report["vllm"]["status"] == "skipped"
