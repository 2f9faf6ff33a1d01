#!/usr/bin/env python3
"""A tool task the tool does not solve alone (issue 54, item 4), in one command: `arithmetic-chain` on its seeds
with each estimator, and the table by number of calls of the scripted best policy, the SFT start, the zero-reward
control and RL on the same held-out problems, with the paired leads and their cluster intervals over problems.

    python benchmarks/chain_table.py --seeds 0,1,2 --estimators gae

Per estimator: `rlhf run full --preset arithmetic-chain --seeds S --set ppo.advantage_estimator=E` (the preset's
`eval.controls: [zero_reward]` runs the control, its `eval.group_by: calls` splits the figures). The scripted policy
(every call in order, then the last result) is run through the one-operation calculator on each held-out problem
of the run's data stage. The runs share RLHF_HOME (--home), so a rerun reads every stage from the cache.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.arith_table import fmt, print_table, table_args  # noqa: E402
from benchmarks.judge_table import rlhf  # noqa: E402

GROUPS = ["all", "1", "2", "3"]
FIGURES = [("SFT start", "reward_mean_sft"), ("zero-reward control", "zero_reward_reward_mean"),
           ("RL", "reward_mean"), ("RL - control", "reward_lead_over_zero_reward"),
           ("RL - SFT", "reward_lead_over_sft")]


def scripted(summary: dict, home: Path) -> dict[str, float]:
    """The scripted best policy's exact match on the run's held-out problems, overall and by calls."""
    os.environ["RLHF_HOME"] = str(home)
    from rlhf_lib.arith_task.chains import parse_chain, scripted_episode
    from rlhf_lib.envs.calculator import OneOpCalculatorEnv
    from stages.artifact_cache import download
    from stages.tracking import setup_mlflow

    setup_mlflow()
    data = download(f"runs:/{summary['stages']['data']['mlflow_run_id']}/data")
    by: dict[str, list[float]] = {g: [] for g in GROUPS}
    for line in (data / "prompts_eval.jsonl").read_text().splitlines():
        row = json.loads(line)
        chain, env = parse_chain(row["prompt"]), OneOpCalculatorEnv()
        env.reset(row)
        reward = [env.step(m) for m in scripted_episode(chain)][-1].reward
        by["all"].append(reward)
        by[str(row["calls"])].append(reward)
    return {g: sum(v) / len(v) for g, v in by.items() if v}


def key(group: str, figure: str) -> str:
    return figure if group == "all" else f"by_calls_{group}/{figure}"


def main() -> None:
    args, sets = table_args(__doc__, "gae")
    rows, record = [], {}
    for est in args.estimators.split(","):
        log = args.home / f"chain-{est}.log"
        out, seconds = rlhf(["run", "full", "--preset", "arithmetic-chain", "--seeds", args.seeds, *sets,
                             "--set", f"ppo.advantage_estimator={est}"], args.home, log)
        for seed, summary in out["seeds"].items():
            ev = dict(summary["eval"])
            best = scripted(summary, args.home)
            record[f"{est}/{seed}"] = {"eval": ev, "scripted": best, "stages": summary["stages"]}
            for group in GROUPS:
                rows.append([{"gae": "PPO", "grpo": "GRPO"}.get(est, est), str(seed), group, f"{best[group]:.3f}"]
                            + [fmt(ev, key(group, k)) for _, k in FIGURES] + [f"{ev['kl_to_ref']:.2f}"])
        print(f"# {est}: {seconds / 60:.1f} min for seeds {args.seeds}", file=sys.stderr)
    head = ["estimator", "seed", "calls", "scripted"] + [name for name, _ in FIGURES] + ["KL of RL"]
    print_table(head, rows, record, args.out)


if __name__ == "__main__":
    main()
