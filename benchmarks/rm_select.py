#!/usr/bin/env python3
"""Choose reward-model settings on the validation file, then report the test file once.

Each candidate (a list of `--set KEY=VALUE`) runs `rlhf run reward` with `data.eval_preferences` set to the
validation file, in its own process (`--parallel` at a time; they share one state dir, so a shared SFT model trains
once). The candidate with the best validation accuracy (ties: the earlier one) then runs once more with the test file
as `data.eval_preferences`. Printed and written to --out as JSON: every candidate's validation accuracy with its
interval next to the baselines of the same run (`rlhf_lib.baselines`), and the chosen one's test figures.

    python benchmarks/rm_select.py --preset smollm2-hh --validation data/hh-harmless/validation.jsonl \\
        --test data/hh-harmless/test.jsonl --candidates candidates.json --set model.name_or_path=DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ("shorter", "ngram", "loglik", "probe")


def run_reward(preset: str, sets: list[str], eval_file: str, home: Path, log: Path) -> dict:
    """One `rlhf run reward`; its reward run's figures (accuracy, interval, baselines) or {"error": ...}."""
    argv = [sys.executable, "-m", "cli.main", "run", "reward", "--preset", preset, "--json",
            *[a for s in [*sets, f"data.eval_preferences={eval_file}"] for a in ("--set", s)]]
    env = {**os.environ, "RLHF_HOME": str(home), "PREFECT_HOME": str(home / "prefect"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    with open(log, "w") as err:
        out = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    seconds = time.monotonic() - t0
    if out.returncode != 0:
        return {"error": f"exit {out.returncode}: {log.read_text()[-800:]}", "seconds": seconds}
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    from mlflow import MlflowClient

    metrics = MlflowClient(summary["mlflow_tracking_uri"]).get_run(
        summary["stages"]["reward"]["mlflow_run_id"]).data.metrics
    return {"accuracy": metrics["reward/heldout_accuracy"],
            "ci95": [metrics["reward/heldout_accuracy_ci95_low"], metrics["reward/heldout_accuracy_ci95_high"]],
            "baselines": {b: metrics.get(f"reward/baseline/{b}_accuracy") for b in BASELINES},
            "seconds": round(seconds, 1), "reward_run": summary["stages"]["reward"]["mlflow_run_id"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--validation", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--candidates", required=True, help="JSON file: {name: [KEY=VALUE, ...], ...}, in order")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every candidate")
    ap.add_argument("--test-set", action="append", default=[], help="KEY=VALUE for the test run only (e.g. "
                    "reward.baselines=true when the candidates skip them)")
    ap.add_argument("--home", default=".rlhf-rm-select", help="state dir shared by the runs")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args(argv)
    candidates: dict[str, list[str]] = json.loads(Path(a.candidates).read_text())
    home = Path(a.home).resolve()
    home.mkdir(parents=True, exist_ok=True)

    def validate(item: tuple[str, list[str]]) -> tuple[str, dict]:
        name, sets = item
        got = run_reward(a.preset, [*a.set, *sets], a.validation, home, home / f"{name}.validation.log")
        print(f"{name}: validation {json.dumps(got)}", flush=True)
        return name, got

    with ThreadPoolExecutor(max(1, a.parallel)) as pool:
        results = dict(pool.map(validate, candidates.items()))
    scored = [(r["accuracy"], -i, n) for i, (n, r) in enumerate(results.items()) if "accuracy" in r]
    result = {"preset": a.preset, "sets": a.set, "validation_file": a.validation, "test_file": a.test,
              "candidates": {n: {"sets": candidates[n], "validation": r} for n, r in results.items()}}
    if scored:
        chosen = max(scored)[2]
        result["chosen"] = chosen
        sets = [*a.set, *candidates[chosen], *a.test_set]
        result["test"] = run_reward(a.preset, sets, a.test, home, home / "test.log")
        print(f"chosen on validation: {chosen}; test: {json.dumps(result['test'])}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0 if scored else 1


if __name__ == "__main__":
    sys.exit(main())
