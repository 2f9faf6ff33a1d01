#!/usr/bin/env python3
"""Side-by-side PPO benchmark: TRL's CPU baseline (trl_ppo_baseline.py, in its own venv) and `rlhf bench ppo`,
alternated A B A B ... in one session so both see the same machine, compared pair by pair.

    bash benchmarks/setup_trl_venv.sh                    # once: the TRL side's venv (benchmarks/.trl-venv)
    python benchmarks/side_by_side.py --pairs 3 --iterations 30 [--set ppo.critic=shared]
    python benchmarks/side_by_side.py --pairs 1 --iterations 4 --preset smollm2-hh \
        --set ppo.stop_at_eos=false --set bench.prompt_length=128 --set ppo.max_new_tokens=48 \
        --set ppo.batch_size=8 --set ppo.minibatches=2 --set ppo.epochs=2 --set bench.num_prompts=64 \
        --set resources.mixed_precision=bf16 --set resources.frozen_dtype=float32 \
        --trl model_path=.rlhf/imported/smollm2 --trl rollout_batch_size=8 --trl prompt_length=128 \
        --trl response_length=48 --trl num_ppo_epochs=2 --trl num_mini_batches=2 \
        --trl local_rollout_forward_batch_size=8 --trl num_prompts=64 --trl n_positions=320 \
        --trl mixed_precision=bf16 --trl frozen_dtype=          # a real model at one precision (RESULTS.md)

Each run is a fresh process; its last stdout line is a JSON summary with the same key names on both sides. The
table gives, per pair, s/iteration (median), generated tokens/s and peak RSS of each side and their ratio
(ours / TRL for RSS, TRL / ours for time: > 1 means ours is better on both). The full record, logs included,
goes to benchmarks/results/side_by_side-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIGURES = ("s_per_iter_median", "tokens_per_s_end_to_end", "peak_rss_mib", "generate_s_median",
           "rollout_score_s_median", "update_s_median", "cpu_s_per_iter_median", "quiet_iterations",
           "measured_iterations")


def run_side(name: str, cmd: list[str], env: dict[str, str], log_dir: Path, index: int) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, env=env, cwd=env.get("PYTHONPATH", ROOT), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (log_dir / f"{index:02d}-{name}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}); log: {log_dir / f'{index:02d}-{name}.log'}\n"
                         + proc.stderr[-2000:])
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["process_wall_s"] = round(wall, 1)
    summary["loadavg_after"] = os.getloadavg()
    return summary


def commands(args) -> dict[str, tuple[list[str], dict[str, str]]]:
    trl_env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1"}
    trl = [args.trl_python, str(HERE / "trl_ppo_baseline.py"), "--iterations", str(args.iterations),
           "--output-dir", str(args.log_dir / "trl-out")]
    for item in args.trl or []:
        key, _, value = item.partition("=")
        trl += [f"--{key.replace('_', '-')}", value]
    ours_env = {**os.environ, "PYTHONPATH": str(args.ours_root), "HF_HUB_OFFLINE": "1"}
    ours = [args.ours_python, "-m", "cli.main", "bench", "ppo", "--json", "--set", f"bench.iterations={args.iterations}"]
    if args.preset:
        ours += ["--preset", args.preset]
    for s in args.set or []:
        ours += ["--set", s]
    return {"trl": (trl, trl_env), "ours": (ours, ours_env)}


def table(pairs: list[dict]) -> str:
    head = ("| pair | s/iter TRL | s/iter ours | speed-up | tokens/s TRL | tokens/s ours | ratio | peak RSS TRL | "
            "peak RSS ours | RSS ours/TRL | quiet iters TRL / ours |")
    lines = [head, "| " + " | ".join(["---"] * 11) + " |"]
    for i, p in enumerate(pairs, 1):
        t, o = p["trl"], p["ours"]
        lines.append(
            f"| {i} | {t['s_per_iter_median']:.3f} | {o['s_per_iter_median']:.3f} | "
            f"{t['s_per_iter_median'] / o['s_per_iter_median']:.2f}x | {t['tokens_per_s_end_to_end']:.0f} | "
            f"{o['tokens_per_s_end_to_end']:.0f} | {o['tokens_per_s_end_to_end'] / t['tokens_per_s_end_to_end']:.2f}x | "
            f"{t['peak_rss_mib']:.0f} MiB | {o['peak_rss_mib']:.0f} MiB | {o['peak_rss_mib'] / t['peak_rss_mib']:.2f} | "
            f"{t['quiet_iterations']}/{t['measured_iterations']} / {o['quiet_iterations']}/{o['measured_iterations']} |"
        )
    speed = [p["trl"]["s_per_iter_median"] / p["ours"]["s_per_iter_median"] for p in pairs]
    rss = [p["ours"]["peak_rss_mib"] / p["trl"]["peak_rss_mib"] for p in pairs]
    lines.append(f"\nmedian over pairs: speed-up {statistics.median(speed):.2f}x (range {min(speed):.2f}-"
                 f"{max(speed):.2f}), peak RSS ours/TRL {statistics.median(rss):.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=3, help="A B pairs (TRL, then ours)")
    p.add_argument("--iterations", type=int, default=30, help="PPO iterations per run, warm-up included")
    p.add_argument("--trl-python", default=str(HERE / ".trl-venv" / "bin" / "python"))
    p.add_argument("--ours-python", default=sys.executable)
    p.add_argument("--ours-root", type=Path, default=ROOT, help="checkout whose code runs as ours (A/B of patches)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="passed on to `rlhf bench ppo` (its keys: "
                   "the pipeline's plus bench.*); the TRL side keeps its own configuration")
    p.add_argument("--preset", help="preset of `rlhf bench ppo` (default its own: trl-baseline)")
    p.add_argument("--trl", action="append", metavar="KEY=VALUE", help="a key of the TRL side's CONFIG "
                   "(trl_ppo_baseline.py), e.g. model_path=DIR or rollout_batch_size=8")
    p.add_argument("--out", type=Path, default=None, help="record file (default benchmarks/results/...)")
    args = p.parse_args(argv)
    if not Path(args.trl_python).exists():
        raise SystemExit(f"{args.trl_python} missing: run `bash benchmarks/setup_trl_venv.sh` first")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or HERE / "results" / f"side_by_side-{stamp}.json"
    args.log_dir = out.with_suffix("")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    cmds = commands(args)
    pairs = []
    for i in range(args.pairs):
        pair = {}
        for side in ("trl", "ours"):
            cmd, env = cmds[side]
            print(f"pair {i + 1}/{args.pairs}: {side} ...", flush=True)
            pair[side] = run_side(side, cmd, env, args.log_dir, 2 * i + (side == "ours"))
            print("   " + ", ".join(f"{k} {pair[side][k]}" for k in FIGURES), flush=True)
        pairs.append(pair)
    text = table(pairs)
    print(text)
    out.write_text(json.dumps({"pairs": pairs, "table": text, "argv": sys.argv[1:], "cpu_count": os.cpu_count()},
                              indent=1))
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
