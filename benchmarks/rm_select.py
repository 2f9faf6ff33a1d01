#!/usr/bin/env python3
"""Choose reward-model settings on the validation file, then report the test file once.

Each candidate (a list of `--set KEY=VALUE`) runs `rlhf run reward` with `data.eval_preferences` set to the
validation file, in its own process (`--parallel` at a time; they share one state dir, so a shared SFT model trains
once). The candidate with the best validation accuracy (ties: the earlier one) then runs once more with the test file
as `data.eval_preferences` (`--test-set` keys added), or with `--rescore` its trained RM is scored on the test file
as it is (`stages.reward_heldout.rescore`: the same figures, without a second training). `--known` takes candidates
validated before from an earlier --out. Printed and written to --out as JSON: every candidate's validation accuracy
with its interval next to the baselines of the same run (`rlhf_lib.baselines`), and the chosen one's test figures.

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


SFT_MODEL: list[str] = []  # ["--sft-model", URI] from --sft-model: every run reuses that SFT model


def run_stage(stage: str, preset: str, sets: list[str], eval_file: str, home: Path, log: Path
              ) -> tuple[dict | None, float]:
    """One `rlhf run STAGE` with `eval_file` as the held-out pairs: its JSON summary (None on failure) and seconds."""
    argv = [sys.executable, "-m", "cli.main", "run", stage, "--preset", preset, "--json", *SFT_MODEL,
            *[a for s in [*sets, f"data.eval_preferences={eval_file}"] for a in ("--set", s)]]
    env = {**os.environ, "RLHF_HOME": str(home), "PREFECT_HOME": str(home / "prefect"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    with open(log, "w") as err:
        out = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    seconds = time.monotonic() - t0
    return (json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None), seconds


def figures(metrics: dict) -> dict:
    return {"accuracy": metrics["reward/heldout_accuracy"],
            "ci95": [metrics["reward/heldout_accuracy_ci95_low"], metrics["reward/heldout_accuracy_ci95_high"]],
            "baselines": {b: metrics.get(f"reward/baseline/{b}_accuracy") for b in BASELINES},
            "leads": {b: metrics.get(f"reward/baseline/{b}_lead") for b in BASELINES},
            "steps": metrics.get("reward/steps")}


def run_reward(preset: str, sets: list[str], eval_file: str, home: Path, log: Path) -> dict:
    """One `rlhf run reward`; its reward run's figures (accuracy, interval, baselines) or {"error": ...}."""
    summary, seconds = run_stage("reward", preset, sets, eval_file, home, log)
    if summary is None:
        return {"error": f"rlhf run reward failed: {log.read_text()[-800:]}", "seconds": seconds}
    from mlflow import MlflowClient

    runs = {k: summary["stages"][k]["mlflow_run_id"] for k in ("data", "sft", "reward")}
    metrics = MlflowClient(summary["mlflow_tracking_uri"]).get_run(runs["reward"]).data.metrics
    return figures(metrics) | {"seconds": round(seconds, 1), "reward_run": runs["reward"], "sft_run": runs["sft"],
                               "data_run": runs["data"]}


def rescore_test(preset: str, sets: list[str], test_file: str, home: Path, log: Path, chosen: dict) -> dict:
    """The chosen candidate's trained RM on the test file, without training it again: `rlhf run sft` with the test
    file makes its data stage (and must find the same SFT model cached); the training files of that data stage must
    equal the candidate's, so its RM is the one a reward stage with the test file would train (training is
    deterministic on a host); then `stages.reward_heldout.rescore`: accuracy, baselines, report."""
    summary, seconds = run_stage("sft", preset, sets, test_file, home, log)
    if summary is None:
        return {"error": f"rlhf run sft failed: {log.read_text()[-800:]}", "seconds": seconds}
    t0 = time.monotonic()
    os.environ |= {"RLHF_HOME": str(home), "MLFLOW_TRACKING_URI": summary["mlflow_tracking_uri"]}
    sys.path.insert(0, str(ROOT))
    from mlflow import MlflowClient

    from flows.settings import load_config
    from rlhf_lib.devices import resolve_device
    from rlhf_lib.process import configure_process
    from stages.artifact_cache import download
    from stages.data import file_digest
    from stages.reward_heldout import rescore

    client = MlflowClient(summary["mlflow_tracking_uri"])

    def local(run_id: str) -> Path:
        tags = client.get_run(run_id).data.tags
        return download(tags["rlhf.artifact_uri"], tags["rlhf.digest"])

    test_data, chosen_data = local(summary["stages"]["data"]["mlflow_run_id"]), local(chosen["data_run"])
    for name in ("sft", "preferences"):
        if file_digest(test_data, name) != file_digest(chosen_data, name):
            return {"error": f"the test file's data stage has other {name} rows than the candidate's (held-out "
                             "overlap dropped): its RM must be trained again (run without --rescore)"}
    if summary["stages"]["sft"]["mlflow_run_id"] != chosen["sft_run"]:
        return {"error": "the test file's SFT model is not the candidate's: run without --rescore"}
    cfg = load_config(preset, None, [*sets, f"data.eval_preferences={test_file}"])
    configure_process(cfg.torch_threads)
    metrics, report, html = rescore(cfg, test_data, local(chosen["sft_run"]), local(chosen["reward_run"]),
                                    resolve_device(cfg.resources.device))
    out = home / "test_rm_report"
    out.mkdir(exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    (out / "report.html").write_text(html, encoding="utf-8")
    return figures(metrics) | {"seconds": round(seconds + time.monotonic() - t0, 1), "rescored": chosen["reward_run"],
                               "report": str(out / "report.html")}


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
    ap.add_argument("--rescore", action="store_true", help="score the chosen candidate's trained RM on the test "
                    "file instead of training it again (refused when the test file changes its training rows)")
    ap.add_argument("--known", help="JSON file of candidates already validated ({name: {sets, validation}}, as "
                    "--out writes them): compared, not run again")
    ap.add_argument("--sft-model", help="SFT model URI for every run (skips the sft stage): the candidates compared "
                    "with --known candidates keep their SFT model when the code has changed since")
    a = ap.parse_args(argv)
    SFT_MODEL[:] = ["--sft-model", a.sft_model] if a.sft_model else []
    candidates: dict[str, list[str]] = json.loads(Path(a.candidates).read_text())
    home = Path(a.home).resolve()
    home.mkdir(parents=True, exist_ok=True)

    def validate(item: tuple[str, list[str]]) -> tuple[str, dict]:
        name, sets = item
        got = run_reward(a.preset, [*a.set, *sets], a.validation, home, home / f"{name}.validation.log")
        print(f"{name}: validation {json.dumps(got)}", flush=True)
        return name, got

    known = json.loads(Path(a.known).read_text()) if a.known else {}
    todo = {n: c for n, c in candidates.items() if n not in known}
    with ThreadPoolExecutor(max(1, a.parallel)) as pool:
        results = {n: known[n]["validation"] for n in candidates if n in known} | dict(pool.map(validate, todo.items()))
    results = {n: results[n] for n in candidates}  # candidate order: ties go to the earlier one
    scored = [(r["accuracy"], -i, n) for i, (n, r) in enumerate(results.items()) if "accuracy" in r]
    result = {"preset": a.preset, "sets": a.set, "validation_file": a.validation, "test_file": a.test,
              "candidates": {n: {"sets": candidates[n], "validation": r} for n, r in results.items()}}
    if scored:
        chosen = max(scored)[2]
        result["chosen"] = chosen
        sets = [*a.set, *candidates[chosen], *a.test_set]
        if a.rescore:
            result["test"] = rescore_test(a.preset, sets, a.test, home, home / "test.log", results[chosen])
        else:
            result["test"] = run_reward(a.preset, sets, a.test, home, home / "test.log")
        print(f"chosen on validation: {chosen}; test: {json.dumps(result['test'])}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0 if scored else 1


if __name__ == "__main__":
    sys.exit(main())
