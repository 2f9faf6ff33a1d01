#!/usr/bin/env python3
"""Every metric of every stage run in one state dir, timings aside, as JSON; or the difference of two such files.

A refactor that must not change any figure (issue 56) runs the same pipelines before and after it and compares:

    RLHF_HOME=/tmp/before rlhf run full --preset demo --seeds 0
    python benchmarks/figures_snapshot.py dump --home /tmp/before > before.json
    ... the same after the change into after.json ...
    python benchmarks/figures_snapshot.py diff before.json after.json

A run is named by its stage and variant (`rlhf.stage`, `rlhf.variant` tags; a pipeline's run by `rlhf.pipeline`), so
two stores of one pipeline each line up run for run (cache keys hold the code's digest: a refactor changes them). Each metric keeps its whole history (step -> value). Wall time,
throughput and memory figures differ from run to run by nature and are left out (`TIMING`). `diff` exits 1 when
anything else differs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# Metric names that measure the host, not the learning: seconds, rates, memory, and the host's own counters.
TIMING = re.compile(r"(seconds|_s$|/s$|_sec|time|tokens_per|per_s|throughput|rss|memory|mem_|_mb$|_gb$|mfu|flops"
                    r"|overlap|duration|it_per|samples_per)", re.IGNORECASE)


def dump(home: Path) -> dict:
    """{`<stage> <cache key>` or the run's name: {"metrics": {name: {step: value}}, "params": {...}}} of `home`'s
    MLflow store (`home/mlflow.db`)."""
    from mlflow.tracking import MlflowClient

    db = home / "mlflow.db"
    if not db.is_file():
        raise SystemExit(f"figures_snapshot: no MLflow store at {db}")
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    out: dict[str, dict] = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], max_results=10000,
                                      order_by=["attributes.start_time ASC"]):
            tags = run.data.tags
            stage = tags.get("rlhf.stage") or (f"pipeline {tags['rlhf.pipeline']}" if "rlhf.pipeline" in tags
                                               else tags.get("mlflow.runName", run.info.run_id))
            name = " ".join(x for x in (stage, tags.get("rlhf.variant")) if x)
            metrics = {}
            for key in sorted(run.data.metrics):
                if TIMING.search(key):
                    continue
                hist = client.get_metric_history(run.info.run_id, key)
                metrics[key] = {str(m.step): m.value for m in sorted(hist, key=lambda m: (m.step, m.timestamp))}
            params = {k: v for k, v in sorted(run.data.params.items()) if not TIMING.search(k)}
            entry = {"experiment": exp.name, "status": run.info.status, "metrics": metrics, "params": params}
            n, base = 1, name
            while name in out:  # several runs of one stage (seeds): numbered in start order
                n, name = n + 1, f"{base} #{n + 1}"
            out[name] = entry
    return out


def diff(a: dict, b: dict) -> list[str]:
    """Each difference between two dumps, one line each; empty when they agree."""
    lines = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            lines.append(f"{name}: only in {'after' if name not in a else 'before'}")
            continue
        for part in ("status", "metrics", "params"):
            x, y = a[name][part], b[name][part]
            if part == "status":
                if x != y:
                    lines.append(f"{name}: status {x} != {y}")
                continue
            for key in sorted(set(x) | set(y)):
                if x.get(key) != y.get(key):
                    lines.append(f"{name}: {part[:-1]} {key}: {str(x.get(key))[:120]} != {str(y.get(key))[:120]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="print the JSON of one state dir")
    d.add_argument("--home", type=Path, required=True)
    c = sub.add_parser("diff", help="compare two dumps; exit 1 on any difference")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        print(json.dumps(dump(args.home), indent=1, sort_keys=True))
        return 0
    a, b = (json.loads(p.read_text()) for p in (args.before, args.after))
    lines = diff(a, b)
    runs = len(set(a) & set(b))
    figures = sum(len(v["metrics"]) for v in a.values())
    print("\n".join(lines) if lines else f"identical: {runs} runs, {figures} metrics (timings aside)")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
