#!/usr/bin/env python3
"""The demo's held-out table per seed, read back from an MLflow store after `rlhf run full --preset demo --seeds ...`:
the reward model against its baselines (held-out and adversarial pairs, its worst topic pair), and PPO, SFT,
best-of-4, best-of-16 and the best constant reply on gold, each with its 95 % interval, and the stage times.

    RLHF_HOME=/tmp/demo python benchmarks/demo_table.py     # the newest full run of each seed in that store
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _fmt(m: dict[str, float], key: str, digits: int = 3) -> str:
    if key not in m:
        return "n/a"
    lo, hi = m.get(f"{key}_ci95_low"), m.get(f"{key}_ci95_high")
    value = f"{m[key]:.{digits}f}"
    return value if lo is None or hi is None else f"{value} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _stage_runs(client, parent) -> dict[str, object]:
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return {r.data.tags.get("rlhf.stage", r.info.run_name.split("-")[0]): r for r in runs}


def _worst_pair(client, run) -> str:
    try:
        path = client.download_artifacts(run.info.run_id, "rm_report/report.json")
    except Exception:  # noqa: BLE001 - an older run without the report: the table says so
        return "n/a"
    adv = json.loads(Path(path).read_text()).get("adversarial") or {}
    worst = (adv.get("topic_pairs") or [{}])[0]
    return f"{worst.get('topic_pair', 'n/a')} {worst.get('accuracy', float('nan')):.2f}"


def main(argv: list[str] | None = None) -> int:
    from mlflow.tracking import MlflowClient

    from stages.tracking import tracking_uri

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="demo", help="config name of the runs (seeded runs add -seed<N>)")
    a = ap.parse_args(argv)
    client = MlflowClient(tracking_uri())
    experiments = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(experiments, "tags.mlflow.runName LIKE 'full-%'", order_by=["start_time DESC"])
    seen: dict[str, object] = {}
    for run in parents:
        name = run.info.run_name.removeprefix("full-").rsplit("-", 1)[0]  # full-<config name>-<config hash>
        if (name == a.name or name.startswith(f"{a.name}-seed")) and name not in seen:
            seen[name] = run
    rm_rows, ppo_rows = [], []
    for name, parent in sorted(seen.items()):
        stages = _stage_runs(client, parent)
        r, e = stages.get("reward"), stages.get("eval")
        if r is None or e is None:
            continue
        rm, ev = r.data.metrics, {k.removeprefix("eval/"): v for k, v in e.data.metrics.items()}
        rm_rows.append(f"| {name} | {_fmt(rm, 'reward/heldout_accuracy')} | "
                       + " | ".join(f"{rm.get(f'reward/baseline/{k}_accuracy', float('nan')):.3f}"
                                    for k in ("shorter", "loglik", "ngram", "probe"))
                       + f" | {rm.get('reward/adversarial_accuracy', float('nan')):.3f} | "
                       + " | ".join(f"{rm.get(f'reward/adversarial/{k}_accuracy', float('nan')):.2f}"
                                    for k in ("topic", "loop", "cut", "politeness", "facts"))
                       + f" | {_worst_pair(client, r)}"
                       + f" | {rm.get('reward/adversarial/weak_topic_pairs', float('nan')):.0f}"
                       + f" | {rm.get('reward/adversarial/baseline/ngram_accuracy', float('nan')):.3f} |")
        ppo_rows.append(f"| {name} | " + " | ".join(_fmt(ev, k, 2) for k in (
            "gold_reward_mean", "gold_reward_mean_sft", "best_of_4_gold_mean", "best_of_16_gold_mean",
            "constant_reply_gold_mean", "gold_lead_over_best_of_4", "gold_lead_over_best_of_16",
            "gold_lead_over_constant_reply", "kl_to_ref")) + " |")
    print("| run | RM held-out acc [95 %] | shorter | loglik | n-gram | probe | RM adversarial | topic | loop | cut "
          "| politeness | facts | worst topic pair | pairs < 0.8 | n-gram adversarial |")
    print("|" + " --- |" * 16)
    print("\n".join(rm_rows))
    print()
    print("| run | PPO gold | SFT gold | best-of-4 gold | best-of-16 gold | constant reply gold | PPO - best-of-4 "
          "| PPO - best-of-16 | PPO - constant | KL |")
    print("|" + " --- |" * 10)
    print("\n".join(ppo_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
