#!/usr/bin/env python3
"""One-step-off-policy PPO against the synchronous loop on `smollm2-arith` (issue 58, item 2), in one command: the
same run at each `ppo.async_rollouts.staleness`, and the table of PPO iterations per hour (from the run's own
`time/iteration_s`: the trainer's wait, score, gae and update; an async rollout's sampling overlaps them), the share
of sampling hidden behind the trainer, the importance weights, and the held-out exact match with its cluster
interval over problems.

    python benchmarks/async_table.py --staleness 0,1 --set resources.mixed_precision=no \
        --set resources.frozen_dtype=float32

Per staleness: `rlhf run full --preset smollm2-arith --seeds S --set ppo.async_rollouts.staleness=K` without the
preset's control and best-of-n (`eval.controls=[]`, `eval.best_of=[]`: what the table compares is the two loops).
The runs share RLHF_HOME (--home): data and the start model are computed once. Run it alone on the host: a figure
from a shared host is not a figure.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.arith_table import fmt, print_table, table_args  # noqa: E402
from benchmarks.judge_table import rlhf  # noqa: E402

HEAD = ["staleness", "seed", "s / iteration (median)", "iterations / hour", "vs staleness 0", "PPO loop min",
        "sampling s (median)", "hidden share", "IS weight mean", "truncated share", "held-out exact match", "KL"]


def ppo_figures(run_id: str, home: Path) -> dict:
    """The PPO run's per-iteration timings and importance-weight figures from its MLflow metrics."""
    import os

    os.environ["RLHF_HOME"] = str(home)
    from mlflow.tracking import MlflowClient

    from stages.tracking import setup_mlflow

    setup_mlflow()
    client = MlflowClient()

    def history(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

    it, sampled, hidden = history("time/iteration_s"), history("time/rollout_s"), history("time/overlap_s")
    steady = it[1:] or it  # iteration 0 also computes the reward offset and (async) waits for its whole rollout
    out = {"s_per_iteration": statistics.median(steady), "loop_s": sum(it), "iterations": len(it),
           "sampling_s": statistics.median(sampled[1:] or sampled),
           "hidden_share": sum(hidden) / sum(sampled) if hidden and sum(sampled) else 0.0}
    for key in ("async/is_weight_mean", "async/is_truncated_frac"):
        values = history(key)
        out[key] = statistics.mean(values) if values else None
    return out


def main() -> None:
    ap_args, sets = table_args(__doc__, "", staleness="0,1")
    staleness = [int(s) for s in ap_args.staleness.split(",")]
    rows, record, base = [], {}, {}
    for k in staleness:
        log = ap_args.home / f"async-{k}.log"
        out, seconds = rlhf(["run", "full", "--preset", "smollm2-arith", "--seeds", ap_args.seeds, *sets,
                             "--set", "eval.controls=[]", "--set", "eval.best_of=[]",
                             "--set", f"ppo.async_rollouts.staleness={k}"], ap_args.home, log)
        for seed, summary in out["seeds"].items():
            ev, ppo = summary["eval"], ppo_figures(summary["stages"]["ppo"]["mlflow_run_id"], ap_args.home)
            base.setdefault(seed, ppo["s_per_iteration"])
            ratio = base[seed] / ppo["s_per_iteration"]
            record[f"{k}/{seed}"] = {"eval": ev, "ppo": ppo, "speedup": ratio, "stages": summary["stages"]}
            opt = (lambda v: "-" if v is None else f"{v:.3f}")
            rows.append([str(k), str(seed), f"{ppo['s_per_iteration']:.2f}", f"{3600 / ppo['s_per_iteration']:.0f}",
                         f"{ratio:.2f}x", f"{ppo['loop_s'] / 60:.1f}", f"{ppo['sampling_s']:.2f}",
                         f"{ppo['hidden_share']:.2f}", opt(ppo["async/is_weight_mean"]),
                         opt(ppo["async/is_truncated_frac"]), fmt(ev, "reward_mean"), fmt(ev, "kl_to_ref")])
        print(f"# staleness {k}: {seconds / 60:.1f} min for seeds {ap_args.seeds}", file=sys.stderr)
    print_table(HEAD, rows, record, ap_args.out)
    print(json.dumps({"host_note": "run alone; see `rlhf bench ppo` for the host's roofline"}), file=sys.stderr)


if __name__ == "__main__":
    main()
