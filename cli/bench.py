"""`rlhf bench [ppo|overhead|cached|all]`: performance figures to read (no test asserts a time). Each benchmark
reads the same presets, config files and `--set` keys as `rlhf run`, plus its own `bench.*` keys."""

from __future__ import annotations

import argparse
import json

from benchmarks.config import PRESET_DIRS, BenchPipelineConfig
from flows.settings import load_config

DEFAULT_PRESET = {"ppo": "trl-baseline", "overhead": "demo", "cached": "micro"}


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="print performance figures (benchmarks/; no test asserts a time)")
    b.add_argument("which", nargs="?", choices=("all", "ppo", "overhead", "cached"), default="all",
                   help="ppo: bare PPO iterations (default preset trl-baseline, TRL's CPU baseline); overhead: the "
                   "Prefect tasks against the bare PPO loop (default preset demo); cached: a fully cached `rlhf run "
                   "full` (default preset micro)")
    b.add_argument("--preset", help="preset of the benchmark(s) run (default: per benchmark, above)")
    b.add_argument("--config", help="YAML file merged over the preset")
    b.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one key, e.g. bench.iterations=10, bench.device=cuda or ppo.critic=shared")
    b.add_argument("--json", action="store_true", help="print the figures as one JSON object on the last line")
    b.set_defaults(fn=cmd_bench)


def config(which: str, args: argparse.Namespace) -> BenchPipelineConfig:
    return load_config(args.preset or DEFAULT_PRESET[which], args.config, args.set or [], BenchPipelineConfig,
                       PRESET_DIRS)


def cmd_bench(args: argparse.Namespace) -> int:
    from cli.runtime import configure_env, flow_settings, start_prefect

    chosen = ["ppo", "overhead", "cached"] if args.which == "all" else [args.which]
    configs = {which: config(which, args) for which in chosen}  # every config is checked before anything runs
    results: dict = {}
    if "ppo" in configs:  # bare, before any Prefect server competes for the cores
        from benchmarks.ppo import bench_ppo

        results["ppo"] = bench_ppo(configs["ppo"])
    if "overhead" in configs:
        configure_env(use_services=False)
        server = start_prefect()
        from benchmarks.overhead import bench_overhead

        with flow_settings(server):
            results["overhead"] = bench_overhead(configs["overhead"])
    if "cached" in configs:
        from benchmarks.cached import bench_cached

        sets = [s for s in args.set or [] if not s.startswith("bench.")]  # `rlhf run` has no bench section
        results["cached"] = bench_cached(args.preset or DEFAULT_PRESET["cached"], args.config, sets)
    if args.json:
        out = results[args.which] if args.which != "all" else results
        print(json.dumps(out, separators=(",", ":")), flush=True)
    return 0
