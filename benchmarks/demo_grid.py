#!/usr/bin/env python3
"""The demo preset's PPO settings chosen on validation, then reported once on test (issue 54, item 5).

    python benchmarks/demo_grid.py --split validation --seeds 0,1      # the grid of docs/data.md, ranked
    python benchmarks/demo_grid.py --split test --seeds 0,1,2 --point 'ppo.kl_coef=0.3 ppo.lr=3e-4 ppo.epochs=2'

Each point is `rlhf run full --preset demo --seeds S --set data.heldout=<split> --set eval.controls=[zero_reward]`
with the point's keys set: the same SFT model and reward model per seed (from the cache: `data.heldout` changes
only which prompts the reports read), PPO, its zero-reward control (the same run, the reward replaced by 0: what
the missing-EOS penalty and the KL alone do) and the eval. The criterion, written down before the runs
(docs/data.md, "The demo's PPO settings"): the highest gold mean of PPO averaged over the seeds, among the points
whose paired gold lead over the zero-reward control has its 95 % cluster interval above 0 on every seed.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.arith_table import fmt, print_table, table_args  # noqa: E402
from benchmarks.judge_table import rlhf  # noqa: E402

GRID = {"ppo.kl_coef": ["0.1", "0.3"], "ppo.lr": ["1e-4", "3e-4"], "ppo.epochs": ["2", "4"]}
FIGURES = [("SFT gold", "gold_reward_mean_sft"), ("control gold", "zero_reward_gold_reward_mean"),
           ("PPO gold", "gold_reward_mean"), ("PPO - control", "gold_lead_over_zero_reward"),
           ("win rate vs control", "win_rate_vs_zero_reward"), ("win rate vs SFT", "win_rate_vs_sft"),
           ("PPO - best-of-4", "gold_lead_over_best_of_4")]


def grid_points() -> list[dict[str, str]]:
    """Every combination of GRID's values."""
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def parse_point(text: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in text.split())


def chosen(results: list[tuple[dict[str, str], dict[str, dict]]]) -> dict[str, str] | None:
    """The criterion: the best mean PPO gold over seeds among points whose lead over the control clears 0 on every
    seed; None when no point does."""
    ok = [(sum(ev["gold_reward_mean"] for ev in evs.values()) / len(evs), point) for point, evs in results
          if all(ev["gold_lead_over_zero_reward_ci95"][0] > 0 for ev in evs.values())]
    return max(ok, key=lambda x: x[0])[1] if ok else None


def main() -> None:
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--split", choices=["validation", "test"], default="validation")
    extra.add_argument("--point", action="append", default=[])
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args, sets = table_args(__doc__, "gae")
    points = [parse_point(p) for p in known.point] or grid_points()
    rows, record, results = [], {}, []
    for point in points:
        words = [x for k, v in point.items() for x in ("--set", f"{k}={v}")]
        name = " ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
        log = args.home / f"demo-{known.split}-{name.replace(' ', '_')}.log"
        out, seconds = rlhf(["run", "full", "--preset", "demo", "--seeds", args.seeds, *sets, *words,
                             "--set", f"data.heldout={known.split}", "--set", "eval.controls=[zero_reward]"],
                            args.home, log)
        evs = {seed: summary["eval"] for seed, summary in out["seeds"].items()}
        results.append((point, evs))
        for seed, ev in evs.items():
            record[f"{name}/{seed}"] = {"point": point, "eval": ev}
            rows.append([name, seed] + [fmt(ev, k) for _, k in FIGURES] + [f"{ev['kl_to_ref']:.2f}",
                                                                           f"{ev['zero_reward_kl_to_ref']:.2f}"])
        print(f"# {name}: {seconds / 60:.1f} min for seeds {args.seeds}", file=sys.stderr, flush=True)
    head = ["point", "seed"] + [n for n, _ in FIGURES] + ["KL of PPO", "KL of control"]
    print_table(head, rows, record, args.out)
    if known.split == "validation":
        best = chosen(results)
        print("\nchosen: " + (" ".join(f"{k}={v}" for k, v in best.items()) if best else "no point clears the control"))


if __name__ == "__main__":
    main()
