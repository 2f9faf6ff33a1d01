"""`rlhf bench cached`: the wall time of a fully cached `rlhf run full` in a fresh process (what a user waits for)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time


def bench_cached(preset: str, config_file: str | None = None, sets: list[str] = (), runs: int = 2
                 ) -> dict[str, float]:
    """A first run fills a fresh store; then `runs` fully cached reruns, each a new process like a user's."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "RLHF_HOME": home}
        env.pop("PREFECT_API_URL", None)
        cmd = [sys.executable, "-m", "cli.main", "run", "full", "--preset", preset, "--json"]
        cmd += (["--config", config_file] if config_file else []) + [a for s in sets for a in ("--set", s)]
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, capture_output=True)
            walls.append(time.perf_counter() - t0)
    result = {"cached_rerun_s_median": round(statistics.median(walls), 2), "cached_rerun_s_max": round(max(walls), 2)}
    print(f"fully cached `rlhf run full --preset {preset}`:  {result['cached_rerun_s_median']:.1f} s wall "
          "(target <= 15 s)")
    return result
