"""`rlhf run`'s start: the throwaway Prefect server spawns before this process imports torch, Prefect, MLflow or
transformers, so its database migrations run on the other core while they import, and the environment the CLI sets
for them (state dir, log levels) is in place before any of them reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import sys
import cli.main as cli
from services import ephemeral

def spawn(self):
    print(sorted(m for m in ("torch", "prefect", "mlflow", "transformers") if m in sys.modules), flush=True)
    raise SystemExit(0)

ephemeral.EphemeralPrefect._spawn = spawn
cli.main(["run", "sft", "--preset", "micro"])
"""


def test_the_temporary_prefect_server_spawns_before_the_heavy_imports(tmp_path):
    env = {**os.environ, "RLHF_HOME": str(tmp_path)}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
