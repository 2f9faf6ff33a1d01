"""`rlhf bench overhead`: what running PPO's phases as Prefect tasks costs over calling them bare.

The same iterations of the preset's PPO (the demo's by default: its model sizes and `ppo.*` settings, a tokenizer
trained on the demo task, fresh models with a random reward head) run bare (`run_iteration(trainer)`) and through
the PPO sub-flow's tasks (`run_iteration(trainer, as_task)`) on two identical trainers, interleaved A B, B A in one
process so both sides see the same machine noise.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from prefect import flow

from benchmarks.config import BenchPipelineConfig
from rlhf_lib.data import read_prompts
from rlhf_lib.demo_task import build_demo_task
from rlhf_lib.models import build_policy, build_scalar_model, train_tokenizer
from rlhf_lib.ppo.loop import run_iteration
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from stages.ppo import as_task


def _trainer(c: BenchPipelineConfig, prompts: list[str], tokenizer) -> PPOTrainer:
    m = c.model
    policy = build_policy(tokenizer, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, n_positions=m.n_positions,
                          seed=m.seed)
    reward = build_scalar_model(policy, seed=1)
    reward.score.weight.data.normal_(0, 0.02, generator=torch.Generator().manual_seed(2))
    models = PPOModels(policy, copy.deepcopy(policy), reward, copy.deepcopy(reward), tokenizer)
    return PPOTrainer(models, prompts, c.ppo, max_prompt_tokens=m.n_positions - c.ppo.max_new_tokens)


def _interleaved(bare: PPOTrainer, tasks: PPOTrainer, iterations: int) -> dict[str, list[float]]:
    """Each iteration twice: bare on one trainer, through the PPO sub-flow's tasks on its identical twin."""

    def timed(trainer: PPOTrainer, call) -> float:
        t0 = time.perf_counter()
        run_iteration(trainer, call) if call else run_iteration(trainer)
        return time.perf_counter() - t0

    # A closure, not flow parameters: trainers are never JSON-encoded for Prefect. The order alternates (A B, B A)
    # because the second of two back-to-back iterations runs a few percent slower whichever it is.
    @flow(name="bench-ppo-overhead")
    def interleaved() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"bare": [], "prefect": []}
        for i in range(iterations):
            for side in (("bare", "prefect") if i % 2 == 0 else ("prefect", "bare")):
                times[side].append(timed(bare, None) if side == "bare" else timed(tasks, as_task))
        return times

    return interleaved()


def bench_overhead(c: BenchPipelineConfig) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        paths = build_demo_task(c.data, tmp)
        prompts = [p.prompt for p in read_prompts(paths["prompts_train"]).rows]
        texts = [line for p in paths.values() for line in Path(p).read_text().splitlines()]
    tokenizer = train_tokenizer(texts, c.model.vocab_size)
    n, warmup = c.bench.iterations, c.bench.warmup_iterations
    times = _interleaved(_trainer(c, prompts, tokenizer), _trainer(c, prompts, tokenizer), n + warmup)
    bare, pref = (statistics.median(times[k][warmup:]) for k in ("bare", "prefect"))
    result = {"ppo_iter_s_bare_median": round(bare, 4), "ppo_iter_s_prefect_median": round(pref, 4),
              "prefect_overhead_pct": round(100 * (pref - bare) / bare, 2), "iterations": n}
    print(f"PPO iteration ({c.name}), bare loop:      {bare:.3f} s (median of {n})")
    print(f"PPO iteration ({c.name}), Prefect tasks:  {pref:.3f} s")
    print(f"Prefect overhead in the loop:  {result['prefect_overhead_pct']:+.1f} %  (target <= 5 %)")
    return result
