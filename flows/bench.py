"""`rlhf bench`: the pipeline's own overheads, as figures to read (tests never assert wall time).

- overhead: the same PPO iterations run bare (`PPOTrainer.step()`) and as the PPO sub-flow's Prefect tasks
  (rollout -> score -> gae -> update), interleaved A B, B A in one process on two identical trainers, so both
  sides see the same machine noise. Target: the Prefect side costs <= 5% more.
- cached: wall time of a fully cached `rlhf run full --preset micro` in a fresh process (what a user waits for).
  Target: <= 15 s.
"""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from prefect import flow

from rlhf_lib.config import DataConfig, PPOConfig
from rlhf_lib.data import read_prompts
from rlhf_lib.demo_task import build_demo_task
from rlhf_lib.models import build_policy, build_scalar_model, train_tokenizer
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from stages.ppo import iteration_tasks


def _trainer(prompts: list[str], tokenizer, cfg: PPOConfig) -> PPOTrainer:
    """Demo-sized fresh models (GPT-2, 2 layers, d=128) with a random reward head: real work, no training first."""
    policy = build_policy(tokenizer, n_layer=2, n_head=4, n_embd=128, n_positions=128, seed=0)
    reward = build_scalar_model(policy, seed=1)
    reward.score.weight.data.normal_(0, 0.02, generator=torch.Generator().manual_seed(2))
    models = PPOModels(policy, copy.deepcopy(policy), reward, copy.deepcopy(reward), tokenizer)
    return PPOTrainer(models, prompts, cfg, max_prompt_tokens=96)


def _interleaved(bare: PPOTrainer, tasks: PPOTrainer, iterations: int) -> dict[str, list[float]]:
    """Each iteration twice: bare on one trainer, through the PPO sub-flow's tasks on its identical twin."""

    def run_bare() -> float:
        t0 = time.perf_counter()
        bare.step()
        return time.perf_counter() - t0

    def run_tasks() -> float:
        t0 = time.perf_counter()
        iteration_tasks(tasks)
        return time.perf_counter() - t0

    # A closure, not flow parameters: trainers are never JSON-encoded for Prefect. The order alternates (A B, B A)
    # because the second of two back-to-back iterations runs a few percent slower whichever it is.
    @flow(name="bench-ppo-overhead")
    def interleaved() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"bare": [], "prefect": []}
        for i in range(iterations):
            first, second = ("bare", "prefect") if i % 2 == 0 else ("prefect", "bare")
            for side in (first, second):
                times[side].append(run_bare() if side == "bare" else run_tasks())
        return times

    return interleaved()


def bench_overhead(iterations: int = 10, warmup: int = 1) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        paths = build_demo_task(DataConfig(n_train_prompts=256, n_eval_prompts=8), tmp)
        prompts = [p.prompt for p in read_prompts(paths["prompts_train"]).rows]
        texts = [line for p in paths.values() for line in Path(p).read_text().splitlines()]
    tokenizer = train_tokenizer(texts, 512)
    cfg = PPOConfig()  # the defaults (the demo preset differs in kl_coef only): 64 prompts x <= 32 tokens, 4 x 4
    times = _interleaved(_trainer(prompts, tokenizer, cfg), _trainer(prompts, tokenizer, cfg), iterations + warmup)
    bare, pref = (statistics.median(times[k][warmup:]) for k in ("bare", "prefect"))
    return {"ppo_iter_s_bare_median": round(bare, 4), "ppo_iter_s_prefect_median": round(pref, 4),
            "prefect_overhead_pct": round(100 * (pref - bare) / bare, 2), "iterations": iterations}


def bench_cached(runs: int = 2) -> dict[str, float]:
    """First run fills a fresh store; then `runs` fully cached reruns, each a new process like a user's."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "RLHF_HOME": home}
        env.pop("PREFECT_API_URL", None)
        cmd = [sys.executable, "-m", "flows.cli", "run", "full", "--preset", "micro"]
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, capture_output=True)
            walls.append(time.perf_counter() - t0)
    return {"cached_rerun_s_median": round(statistics.median(walls), 2), "cached_rerun_s_max": round(max(walls), 2)}


def run_benchmarks(which: str = "all", iterations: int = 10) -> dict[str, float]:
    results: dict[str, float] = {}
    if which in ("all", "overhead"):
        results.update(bench_overhead(iterations))
        print(f"PPO iteration, bare loop:      {results['ppo_iter_s_bare_median']:.3f} s (median of {iterations})")
        print(f"PPO iteration, Prefect tasks:  {results['ppo_iter_s_prefect_median']:.3f} s")
        print(f"Prefect overhead in the loop:  {results['prefect_overhead_pct']:+.1f} %  (target <= 5 %)")
    if which in ("all", "cached"):
        results.update(bench_cached())
        print(f"fully cached `rlhf run full`:  {results['cached_rerun_s_median']:.1f} s wall (target <= 15 s)")
    return results
