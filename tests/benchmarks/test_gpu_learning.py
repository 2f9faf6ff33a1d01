"""benchmarks/gpu_learning.sh and gpu_learning.py without a GPU: every scale's keys are valid keys of the presets
they set (the full scale runs only on a lent GPU), and the whole command runs at tiny size on the CPU (slow set):
the judge, the HH pipeline with DPO and the zero-reward control, the arithmetic table, and the printed tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_learning import SCALES, device_sets
from flows.settings import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scale", sorted(SCALES))
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_scales_keys_load_on_their_presets(scale, device):
    keys = SCALES[scale]
    spec = '{name: judge, kind: model, model: "runs:/0123/model"}'
    hh = load_config("smollm2-hh", None, [*device_sets(device), *keys["hh"], "data.max_train_rows=960",
                                          "dpo.enabled=true", "eval.controls=[zero_reward]", f"eval.judge={spec}"])
    assert hh.dpo.enabled and hh.eval.controls == ["zero_reward"] and hh.data.max_train_rows == 960
    judge = load_config("smollm2-hh", None, [*device_sets(device), *keys["judge"], "data.skip_rows=960",
                                             "name=judge", "reward.name_or_path=smollm2"])
    assert judge.data.skip_rows == 960 and judge.name == "judge"
    arith = load_config("smollm2-arith", None, [*device_sets(device), *keys["arith"]])
    assert arith.resources.device == device
    if scale == "full":  # every held-out prompt, several epochs
        assert hh.eval.max_prompts is None and hh.reward.epochs == 2 and hh.dpo.epochs == 2


@pytest.mark.slow
def test_the_dry_run_prints_every_table_on_the_cpu(tmp_path):
    from tests.rlhf_lib.gguf_writer import write_tiny_llama_gguf

    gguf = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(gguf)
    cmd = ["bash", str(ROOT / "benchmarks" / "gpu_learning.sh"), "--model", str(gguf), "--device", "cpu",
           "--scale", "tiny", "--judge-skip", "12", "--seeds", "0", "--home", str(tmp_path / "home")]
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OUT": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads((tmp_path / "gpu_learning.json").read_text())
    policies = [r["policy"] for r in got["hh"]["policies"]]
    assert policies == ["SFT", "best-of-4 of SFT", "PPO", "DPO policy", "zero-reward control"]
    assert [r["win rate of ↓ over →"] for r in got["hh"]["matrix"]] == ["PPO", "DPO policy", "zero-reward control"]
    assert set(got["hh"]["accuracy"]) == {"judge RM (its own rows)", "reward model", "DPO implicit reward"}
    assert "gae/0" in got["arith"]["record"]
    printed = (tmp_path / "gpu_learning.md").read_text()
    assert "## HH harmless" in printed and "## smollm2-arith, seeds 0" in printed and "| DPO policy |" in printed
