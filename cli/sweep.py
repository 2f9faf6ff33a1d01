"""`rlhf sweep ppo ...`: the command around the `rlhf-sweep` flow (`flows.sweep`)."""

from __future__ import annotations

import argparse
import json
import os

from rlhf_lib.config import ConfigError


def add_parser(sub) -> None:
    from flows.settings import preset_names

    s = sub.add_parser("sweep", help="PPO + eval once per point against one cached SFT and reward model, ranked")
    s.add_argument("stage", choices=("ppo",), help="what is swept (ppo: PPO and eval keys)")
    s.add_argument("--preset", default="demo", help=f"named preset, one of: {', '.join(preset_names())}")
    s.add_argument("--config", help="YAML file merged over the preset")
    s.add_argument("--set", action="append", metavar="KEY=V1,V2", help="a swept key and its values (a grid over "
                   "every such key), or one value for all points, e.g. ppo.kl_coef=0.02,0.1,0.3")
    s.add_argument("--point", action="append", metavar="'K=V K=V'", help="one listed point (repeatable), e.g. "
                   "'ppo.kl_coef=0.05 ppo.lr=1e-5'; added to the grid")
    s.add_argument("--deployment", default="rlhf/eval", help="deployment each point runs as (pipeline eval: PPO "
                   "and eval, upstream from the cache), in parallel across its workers (default rlhf/eval)")
    s.add_argument("--here", action="store_true", help="run the points one after another in this process "
                   "instead (no Prefect server needed)")
    s.add_argument("--sft-model", metavar="URI", help="sweep against this SFT model instead of the sft stage's")
    s.add_argument("--reward-model", metavar="URI", help="sweep against this reward model, e.g. "
                   "models:/rlhf-reward@champion, instead of the reward stage's")
    s.add_argument("--json", action="store_true", help="print the result as one JSON object on the last line")
    s.set_defaults(fn=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from cli.runtime import configure_env, flow_settings, start_prefect
    from flows.settings import load_config
    from flows.sweep import parse_grid, parse_point, point_configs

    base, grid = parse_grid(args.set or [])
    points = grid + [parse_point(p) for p in args.point or []]
    configs = [cfg for _, cfg in point_configs(args.preset, args.config, base, points, args.stage)]  # all, first
    config = load_config(args.preset, args.config, base)
    configure_env()
    if not args.here and not os.environ.get("PREFECT_API_URL"):
        raise ConfigError(f"rlhf sweep submits each point to the deployment {args.deployment} on a Prefect server: "
                          "set PREFECT_API_URL or start `rlhf up`, or run the points here with --here")
    from services.stores import preflight

    preflight(os.environ.get("MLFLOW_TRACKING_URI"), os.environ.get("PREFECT_API_URL"))
    server = start_prefect()
    from flows.sweep import sweep
    from rlhf_lib.process import configure_process

    configure_process(config.torch_threads)
    with flow_settings(server):
        result = sweep(config=config, points=points, configs=configs, deployment=None if args.here else args.deployment,
                       sft_model=args.sft_model, reward_model=args.reward_model)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print_ranking(result)
    return 0 if result["status"] == "completed" else 1


def print_ranking(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from rlhf_lib.intervals import with_interval

    rows = result["ranking"]
    metric = rows[0]["metric"]
    keys = [k for k in rows[0] if "." in k]
    table = Table(title=f"PPO sweep ranked by {metric} (MLflow run {result['mlflow_run_id']})", title_justify="left")
    for col in ("rank", *keys, f"{metric} [95 %]", "kl_to_ref", "length", "policy", "status"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["rank"]), *(r[k] for k in keys), with_interval(r[metric], r[f"{metric}_ci95"]),
                      _num(r["kl_to_ref"]), _num(r["response_length_mean"]),
                      (r["policy"] or "") + (" (champion)" if r.get("champion") else ""),
                      r["status"] if r["status"] == "completed" else f"{r['status']}: {r['message']}")
    Console(width=None if os.isatty(1) else 200).print(table)
    print("against " + ", ".join(f"{k} {v}" for k, v in result["upstream"].items()))


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"
