"""`rlhf bench ppo`: PPO iterations (`rlhf_lib.ppo.loop.run_iteration`, bare) with the timings of each phase,
throughput, peak memory and achieved FLOP/s against a matmul roofline measured in the same process.

By default on the configuration of TRL's CPU baseline (`--preset trl-baseline`, benchmarks/trl_ppo_baseline.py):
the same work per iteration as TRL's PPOv2 trainer. B prompts of exactly P tokens, R sampled tokens each with no
early stop, a reference, value and reward forward, then epochs x minibatches of policy + value forward/backward and
optimizer steps; four random-init GPT-2 models (policy, frozen reference copy, value, reward) of `model.*` sizes.
Any preset works (`--preset demo` measures the demo's shapes and PPO settings on the same synthetic prompts).

Over 300 lines because the benchmark's config, its run and its printed report belong together: each figure it
prints is computed next to the line that prints it.
"""

from __future__ import annotations

import copy
import os
import resource
import statistics
import time

import numpy as np
import torch

from benchmarks.config import BenchPipelineConfig
from benchmarks.flops import Shape, ppo_iteration_flops
from rlhf_lib.devices import DTYPES
from rlhf_lib.ppo.loop import run_iteration
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from rlhf_lib.process import configure_process


def build_tokenizer(c: BenchPipelineConfig, corpus: list[str]):
    """BPE (Metaspace) trained on the synthetic corpus, as TRL's baseline does, with EOS and PAD given the ids just
    past the model's vocabulary: the policy can never sample them, so every response runs all `ppo.max_new_tokens`
    tokens, all real (TRL: `stop_token=None`, `pad_outside_vocab`). The corpus yields at most 1024 tokens; a larger
    `model.vocab_size` (GPT-2's 50,257) is filled with entries no merge produces, or EOS would land inside it."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    size = min(c.model.vocab_size, 1024)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=size, special_tokens=["[UNK]"], show_progress=False))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]  # ids 0 .. len - 1
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), c.model.vocab_size)})
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), unk_token="[UNK]")
    fast.add_special_tokens({"eos_token": "[EOS]", "pad_token": "[PAD]"})  # ids vocab_size, vocab_size + 1
    return fast


def pretrained_dir(c: BenchPipelineConfig) -> str | None:
    """The local folder of `model.name_or_path` (a `.gguf` or `smollm2` imported first), or None for the fresh
    GPT-2 of `model.*` sizes."""
    if not c.model.name_or_path:
        return None
    from stages.models_io import local_model

    return local_model(c.model.name_or_path, c.model.revision)


def make_prompts(c: BenchPipelineConfig) -> tuple[object, list[str]]:
    """A seeded Zipf corpus of random words (TRL baseline's recipe, seed `data.seed`); prompts are sentences of at
    least P tokens, of which the trainer keeps the last P. A pretrained model's own tokenizer counts the tokens."""
    rng = np.random.default_rng(c.data.seed)
    lexicon = sorted({"".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(2, 9)))
                      for _ in range(3000)})
    weights = 1.0 / (1.0 + rng.permutation(len(lexicon)))
    weights /= weights.sum()
    corpus = [" ".join(rng.choice(lexicon, size=int(rng.integers(24, 48)), p=weights)) for _ in range(4000)]
    if (folder := pretrained_dir(c)) is not None:
        from rlhf_lib.models import load_tokenizer

        tokenizer = load_tokenizer(folder)
    else:
        tokenizer = build_tokenizer(c, corpus)
    b = c.bench
    prompts = [s for s in corpus if len(tokenizer(s, add_special_tokens=False)["input_ids"]) >= b.prompt_length]
    if len(prompts) < b.num_prompts:
        raise ValueError(f"only {len(prompts)} synthetic prompts have bench.prompt_length={b.prompt_length} tokens")
    return tokenizer, prompts[: b.num_prompts]


def build_models(c: BenchPipelineConfig, tokenizer) -> PPOModels:
    """Policy, reference (a copy of the initial policy), value and reward models: random-init GPT-2 of `model.*`
    sizes, as TRL's baseline builds them (seeds model.seed, + 1, + 2; no dropout)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, GPT2Config

    m, b = c.model, c.bench
    if (folder := pretrained_dir(c)) is not None:
        return _pretrained_models(c, folder, tokenizer)

    def config(**extra) -> GPT2Config:
        return GPT2Config(vocab_size=m.vocab_size, n_positions=m.n_positions, n_embd=m.n_embd, n_layer=m.n_layer,
                          n_head=m.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          activation_function=b.activation_function, bos_token_id=None, eos_token_id=None, **extra)

    dtype = getattr(torch, b.dtype)
    kw = dict(attn_implementation=b.attn_implementation, dtype=dtype)
    torch.manual_seed(m.seed)
    policy = AutoModelForCausalLM.from_config(config(), **kw)
    ref = copy.deepcopy(policy)
    torch.manual_seed(m.seed + 1)
    separate = c.ppo.has_critic and c.ppo.critic == "separate"
    value = AutoModelForSequenceClassification.from_config(config(num_labels=1), **kw) if separate else None
    torch.manual_seed(m.seed + 2)
    reward = AutoModelForSequenceClassification.from_config(config(num_labels=1), **kw)
    models = [x if x is None else x.to(device=b.device, dtype=dtype).eval()
              for x in (policy, None if c.ppo.lora else ref, reward, value)]
    return PPOModels(*models, tokenizer=tokenizer)


def _pretrained_models(c: BenchPipelineConfig, folder: str, tokenizer) -> PPOModels:
    """The four models from a pretrained folder, as TRL's baseline loads them with `--model-path`: the policy, a
    copy as reference, and value and reward models on the same backbone with fresh scalar heads (seeds model.seed
    + 1 and + 2)."""
    from rlhf_lib.models import build_policy, build_scalar_model

    dtype, b = getattr(torch, c.bench.dtype), c.bench
    policy = build_policy(tokenizer, folder, dtype=dtype)
    ref = copy.deepcopy(policy)
    separate = c.ppo.has_critic and c.ppo.critic == "separate"
    value = build_scalar_model(policy, seed=c.model.seed + 1) if separate else None
    reward = build_scalar_model(policy, seed=c.model.seed + 2)
    for head, seed in ((value, c.model.seed + 1), (reward, c.model.seed + 2)):
        if head is not None:  # a random head, as TRL's from_pretrained gives it (a zero head scores 0 everywhere)
            torch.manual_seed(seed)
            torch.nn.init.normal_(head.score.weight, std=0.02)
    models = [x if x is None else x.to(device=b.device, dtype=dtype).eval()
              for x in (policy, None if c.ppo.lora else ref, reward, value)]
    return PPOModels(*models, tokenizer=tokenizer)


def model_shape(c: BenchPipelineConfig) -> Shape:
    """The FLOP-count shape of the policy: a pretrained folder's config, else the fresh GPT-2 of `model.*`."""
    if (folder := pretrained_dir(c)) is not None:
        from transformers import AutoConfig

        return Shape.of(AutoConfig.from_pretrained(folder))
    m = c.model
    return Shape(m.n_layer, m.n_embd, m.vocab_size)


def matmul_roofline(device: str, dtype: torch.dtype, n: int | None = None, reps: int = 5) -> float:
    """Best achieved GFLOP/s of an (n x n) @ (n x n) matmul on this device and thread count (n = 1024 on a CPU,
    8192 on a GPU: large enough to reach the device's practical peak)."""
    n = n or (8192 if device.startswith("cuda") else 1024)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(3):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - t0) / 3)
    return 2 * n**3 / best / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def machine_busy_s() -> float:
    """CPU-seconds used by every process on the machine so far (/proc/stat), to tell quiet iterations apart."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _iteration(trainer: PPOTrainer, device: str) -> dict[str, float]:
    """`run_iteration` with a device sync after each phase, so that phase times are honest on a GPU."""
    def synced(phase, fn, *args):
        out = fn(*args)
        _sync(device)
        return out

    cpu0, busy0, t0 = time.process_time(), machine_busy_s(), time.perf_counter()
    ro, stats = run_iteration(trainer, synced)
    # Every row runs max_new_tokens through sampling, scoring and the update while the batch is that wide: a reply
    # that ends early (an EOS under ppo.stop_at_eos=false) is masked, not shortened, so the work is the same.
    if ro.response.shape[1] != trainer.cfg.max_new_tokens:
        raise RuntimeError("the rollout stopped early: the benchmark needs max_new_tokens sampled "
                           "(set ppo.stop_at_eos=false)")
    cpu = time.process_time() - cpu0
    return {"total_s": time.perf_counter() - t0, "generate_s": stats["time/rollout_s"],
            "rollout_score_s": stats["time/score_s"] + stats["time/gae_s"], "update_s": stats["time/update_s"],
            "cpu_s": cpu, "foreign_cpu_s": max(0.0, machine_busy_s() - busy0 - cpu), "peak_rss_mib": peak_rss_mib()}


def run(c: BenchPipelineConfig, on_iteration=None) -> dict:
    """Build everything, run `bench.iterations` PPO iterations, return the summary (TRL's key names where shared)."""
    configure_process(c.torch_threads)
    if c.bench.prompt_length + c.ppo.max_new_tokens > c.model.n_positions:
        raise ValueError("bench.prompt_length + ppo.max_new_tokens must be <= model.n_positions")
    t_setup = time.perf_counter()
    tokenizer, prompts = make_prompts(c)
    models = build_models(c, tokenizer)
    # The precision of `rlhf run ppo` (rlhf_lib/ppo/loop.py:build_trainer): autocast and the frozen models' dtype.
    trainer = PPOTrainer(models, prompts, c.ppo, max_prompt_tokens=c.bench.prompt_length,
                         mixed_precision=c.resources.mixed_precision,
                         frozen_dtype=DTYPES[c.resources.frozen_dtype])
    rss_after_models = peak_rss_mib()
    setup_s = time.perf_counter() - t_setup
    if c.bench.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    iters = []
    for i in range(c.bench.iterations):
        iters.append(_iteration(trainer, c.bench.device))
        if on_iteration:
            on_iteration(i + 1, iters[-1])
    roofline = matmul_roofline(c.bench.device, getattr(torch, c.bench.dtype))
    return summarize(c, iters, roofline, rss_after_models_mib=rss_after_models, setup_s=setup_s)


def summarize(c: BenchPipelineConfig, iters: list[dict], roofline_gflops: float, **extra) -> dict:
    b, p, m = c.bench, c.ppo, c.model
    meas = iters[b.warmup_iterations:] or iters

    def med(key, rows=meas):
        return statistics.median(r[key] for r in rows) if rows else None

    tot = [r["total_s"] for r in meas]
    quiet = [r for r in meas if r["foreign_cpu_s"] < 0.1 * r["total_s"]]
    shape = model_shape(c)
    flops = ppo_iteration_flops(shape, shape, shape, p.batch_size, b.prompt_length, p.max_new_tokens, p.epochs,
                                shared_critic=p.critic == "shared")
    toks = p.batch_size * p.max_new_tokens
    phase = {"generate": med("generate_s"), "score": med("rollout_score_s"), "update": med("update_s")}
    peak = (b.peak_tflops * 1e3) if b.peak_tflops else roofline_gflops
    out = {
        "impl": "rlhf_lib", "torch": torch.__version__, "iterations": len(iters), "measured_iterations": len(meas),
        "s_per_iter_median": round(statistics.median(tot), 4), "s_per_iter_min": round(min(tot), 4),
        "s_per_iter_max": round(max(tot), 4),
        "s_per_iter_p25": round(statistics.quantiles(tot, n=4, method="inclusive")[0] if len(tot) > 1 else tot[0], 4),
        "cpu_s_per_iter_median": round(med("cpu_s"), 4), "quiet_iterations": len(quiet),
        "s_per_iter_median_quiet": round(med("total_s", quiet), 4) if quiet else None,
        "foreign_cpu_s_median": round(med("foreign_cpu_s"), 3),
        "generate_s_median": round(phase["generate"], 4), "rollout_score_s_median": round(phase["score"], 4),
        "update_s_median": round(phase["update"], 4),
        "other_s_median": round(statistics.median(r["total_s"] - r["generate_s"] - r["rollout_score_s"]
                                                  - r["update_s"] for r in meas), 4),
        "gen_tokens_per_iter": toks,
        "tokens_per_s_end_to_end": round(toks / statistics.median(tot), 1),
        "tokens_per_s_generate": round(toks / phase["generate"], 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "gflop_per_iter": round(flops["total"] / 1e9, 2),
        "gflops_achieved": round(flops["total"] / 1e9 / statistics.median(tot), 1),
        **{f"gflops_{k}": round(flops[k] / 1e9 / v, 1) for k, v in phase.items()},
        "roofline_gflops": round(roofline_gflops, 1),
        "roofline_share": round(flops["total"] / 1e9 / statistics.median(tot) / roofline_gflops, 3),
        "mfu_update": round(flops["update"] / 1e9 / phase["update"] / peak, 4),
        "mfu_reference": "peak_tflops" if b.peak_tflops else "measured matmul roofline",
        "optimizer_steps_per_iter": p.epochs * p.minibatches,
        **{k: round(v, 2) for k, v in extra.items()},
        "config": c.model_dump(mode="json"),
    }
    if b.device.startswith("cuda"):
        out["peak_gpu_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def _line(i: int, r: dict) -> str:
    return (f"iter {i:3d}  total {r['total_s']:.3f}s  gen {r['generate_s']:.3f}s  score {r['rollout_score_s']:.3f}s  "
            f"update {r['update_s']:.3f}s  rss {r['peak_rss_mib']:.0f}MiB  cpu {r['cpu_s']:.2f}s  "
            f"foreign-cpu {r['foreign_cpu_s']:.2f}s")


def report(s: dict) -> str:
    c = s["config"]
    m, p, b = c["model"], c["ppo"], c["bench"]
    times = f"{s['s_per_iter_median']:.3f} ({s['s_per_iter_min']:.3f} - {s['s_per_iter_max']:.3f})"
    split = " / ".join(f"{s[k]:.3f}" for k in ("generate_s_median", "rollout_score_s_median", "update_s_median",
                                                "other_s_median"))
    rates = " / ".join(f"{s[k]:.1f}" for k in ("gflops_generate", "gflops_score", "gflops_update"))
    rows = [
        ("s / iteration, median (min - max)", f"{times} over {s['measured_iterations']} iterations"),
        ("  generate / score+GAE / update / other", f"{split} s"),
        ("generated tokens / s, end-to-end",
         f"{s['tokens_per_s_end_to_end']:.0f}  (generate only: {s['tokens_per_s_generate']:.0f})"),
        ("peak RSS", f"{s['peak_rss_mib']:.0f} MiB  (after building the models: {s['rss_after_models_mib']:.0f})"),
        ("work per iteration (analytic)", f"{s['gflop_per_iter']:.1f} GFLOP"),
        ("achieved GFLOP/s, whole iteration", (f"{s['gflops_achieved']:.1f} = {100 * s['roofline_share']:.0f} % "
                                               f"of a {s['roofline_gflops']:.0f} GFLOP/s matmul roofline")),
        ("  generate / score / update", f"{rates} GFLOP/s"),
        ("MFU of the update", f"{100 * s['mfu_update']:.1f} % (vs {s['mfu_reference']})"),
        ("quiet iterations; CPU-s per iteration",
         f"{s['quiet_iterations']} of {s['measured_iterations']}; {s['cpu_s_per_iter_median']:.2f}"),
    ]
    if "peak_gpu_mem_mib" in s:
        rows.append(("peak GPU memory (allocated)", f"{s['peak_gpu_mem_mib']:.0f} MiB"))
    model = (m["name_or_path"] if m.get("name_or_path")
             else f"GPT-2 {m['n_layer']}x{m['n_embd']}, vocab {m['vocab_size']}")
    head = (f"PPO ({c['name']}), {p['batch_size']} prompts x {b['prompt_length']} + {p['max_new_tokens']} tokens, "
            f"{model}, {b['dtype']} on {b['device']}{precision(c['resources'])}, {c['torch_threads']} threads")
    return "\n".join([head] + [f"  {k:40s} {v}" for k, v in rows])


def precision(resources: dict) -> str:
    """", bf16 autocast, frozen models in bfloat16" for the report's head; "" for plain weights."""
    parts = ([f"{resources['mixed_precision']} autocast"] if resources["mixed_precision"] != "no" else []) + (
        [f"frozen models in {resources['frozen_dtype']}"] if resources["frozen_dtype"] != "float32" else [])
    return "".join(", " + p for p in parts)


def bench_ppo(c: BenchPipelineConfig) -> dict:
    """Run the benchmark, printing a line per iteration and the report; returns the summary."""
    summary = run(c, on_iteration=lambda i, r: print(_line(i, r), flush=True))
    print(report(summary), flush=True)
    return summary
