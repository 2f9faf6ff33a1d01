#!/usr/bin/env python3
"""GPU check of `rlhf bench ppo`: PPO iterations of GPT-2 124M-size models (12 layers, d = 768, vocabulary 50257)
in bf16, 64 prompts x 64 tokens, 128 sampled tokens each. Prints tokens/s, the per-phase split, peak GPU memory and
the MFU of the update phase, and writes the JSON summary to $OUT/gpu_check.json when $OUT is set.

    bash benchmarks/gpu_check.sh                          # cuda, bfloat16
    python benchmarks/gpu_check.py --device cpu --tiny    # CPU smoke test of the same path (seconds)

Weights are bf16 without an fp32 master copy: a throughput check, not a training recipe (the 3e-6 steps vanish).
MFU is against --peak-tflops (default: 989, dense bf16 of an H100/H200 SXM, when the device name says H100/H200;
otherwise the bf16 matmul roofline measured in the same process).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GPT2_124M = {"model.n_layer": 12, "model.n_head": 12, "model.n_embd": 768, "model.vocab_size": 50257,
             "model.n_positions": 1024, "bench.prompt_length": 64, "ppo.max_new_tokens": 128, "ppo.batch_size": 64,
             "ppo.minibatches": 4, "bench.iterations": 6, "bench.warmup_iterations": 2}
TINY = {"model.n_layer": 1, "model.n_head": 2, "model.n_embd": 32, "model.vocab_size": 256, "model.n_positions": 64,
        "eval.max_new_tokens": 8,
        "bench.prompt_length": 8, "ppo.max_new_tokens": 8, "ppo.batch_size": 8, "ppo.minibatches": 2,
        "bench.num_prompts": 16, "bench.iterations": 2, "bench.warmup_iterations": 1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--tiny", action="store_true", help="a tiny config (CPU smoke test of this script)")
    p.add_argument("--peak-tflops", type=float, default=None, help="datasheet peak for MFU")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any `rlhf bench ppo` key, e.g. "
                   "ppo.critic=shared")
    a = p.parse_args(argv)

    import torch

    from benchmarks.config import PRESET_DIRS, BenchPipelineConfig
    from benchmarks.ppo import bench_ppo
    from flows.settings import load_config

    peak = a.peak_tflops
    if peak is None and a.device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = 989.0 if any(g in name for g in ("H100", "H200")) else None
        print(f"# device: {name}; MFU against {f'{peak} TFLOP/s' if peak else 'the measured roofline'}", flush=True)
    sets = [f"{k}={v}" for k, v in (TINY if a.tiny else GPT2_124M).items()]
    sets += [f"bench.device={a.device}", f"bench.dtype={a.dtype}"] + ([f"bench.peak_tflops={peak}"] if peak else [])
    summary = bench_ppo(load_config("trl-baseline", None, sets + a.set, BenchPipelineConfig, PRESET_DIRS))
    keys = ("tokens_per_s_end_to_end", "tokens_per_s_generate", "generate_s_median", "rollout_score_s_median",
            "update_s_median", "mfu_update", "mfu_reference", "gflops_update", "roofline_gflops", "peak_gpu_mem_mib")
    print("gpu_check: " + ", ".join(f"{k}={summary.get(k)}" for k in keys), flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
