"""A secret planted in a reward URL reaches none of MLflow's store, Prefect's database or the terminal
(rlhf_lib/redaction.py): the grep of issue 36, item 4."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLANTED = "PlantedKey9f3a7c"


def _grep(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_a_planted_api_key_is_nowhere(tmp_path):
    rewards = ('[{name: rm, kind: model}, {name: judge, kind: http, weight: 0.5, '
               f'url: "http://127.0.0.1:9/score?api_key={PLANTED}"}}]')
    env = {**os.environ, "RLHF_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run([sys.executable, "-m", "cli.main", "run", "sft", "--preset", "micro", "--set",
                          f"ppo.rewards={rewards}"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert PLANTED not in out.stdout + out.stderr
    found = _grep(tmp_path / "home", PLANTED.encode())
    assert not found, found
    assert _grep(tmp_path / "home", b"api_key=***")  # the redacted config is there (MLflow's config.json, Prefect)
    bad = subprocess.run([sys.executable, "-m", "cli.main", "run", "sft", "--preset", "micro", "--set",
                          f'ppo.rewards=[{{name: j, kind: http, url: "ftp://judge/?api_key={PLANTED}"}}]'],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "api_key=***" in bad.stderr and PLANTED not in bad.stdout + bad.stderr
