"""PPO iterations of `PPOTrainer`, bare, on the configuration of the TRL CPU baseline (benchmarks/trl_ppo_baseline.py),
with timings per phase, throughput, peak memory and achieved FLOP/s against a matmul roofline measured in-process.

The same work per iteration as TRL's PPOv2 trainer: B prompts of exactly P tokens, R sampled tokens each with no
early stop, a reference, value and reward forward, then epochs x minibatches of policy + value forward/backward
and optimizer steps, four separate random-init GPT-2 models (policy, frozen reference copy, value, reward).
Pure: no Prefect, no MLflow; `flows/bench_ppo.py` is the command around it.
"""

from __future__ import annotations

import copy
import os
import resource
import statistics
import time
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from rlhf_lib.config import PPOConfig
from rlhf_lib.flops import Shape, ppo_iteration_flops
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from rlhf_lib.process import configure_process


class BenchPPOConfig(BaseModel):
    """Keys named as in TRL's CONFIG (trl_ppo_baseline.py) where the two share a meaning; defaults equal TRL's."""

    model_config = ConfigDict(extra="forbid")
    iterations: int = Field(30, ge=1, description="PPO iterations, warm-up included.")
    warmup_iterations: int = Field(1, ge=0, description="Leading iterations left out of the statistics.")
    torch_threads: int = Field(2, ge=1, description="torch intra-op threads (inter-op: 1), set once.")
    seed: int = Field(42, description="Models: policy seed, value seed + 1, reward seed + 2; prompts and sampling.")
    vocab_size: int = Field(1024, ge=64, description="Model vocabulary; the BPE tokenizer has min(this, 1024).")
    num_prompts: int = Field(512, ge=1, description="Synthetic prompts the sampler cycles through.")
    prompt_length: int = Field(16, ge=1, description="Every prompt is exactly this many tokens (no padding).")
    n_layer: int = Field(4, ge=1, description="GPT-2 blocks of every model.")
    n_head: int = Field(4, ge=1, description="Attention heads.")
    n_embd: int = Field(256, ge=8, description="Hidden size.")
    n_positions: int = Field(64, ge=2, description="Position embeddings (>= prompt_length + response_length).")
    attn_implementation: str = Field("sdpa", description="transformers attention backend.")
    activation_function: str = Field("gelu_pytorch_tanh", description="GPT-2 MLP activation: gelu_pytorch_tanh "
                                     "(the project's models: tanh GELU in one fused kernel) or gelu_new (TRL's "
                                     "GPT-2 default: the same function in 7 elementwise ops).")
    rollout_batch_size: int = Field(64, ge=1, description="Prompts per iteration.")
    response_length: int = Field(32, ge=1, description="Tokens sampled per prompt, always all of them.")
    num_ppo_epochs: int = Field(1, ge=1, description="PPO epochs over each rollout.")
    num_mini_batches: int = Field(4, ge=1, description="Minibatches per epoch, one optimizer step each.")
    score_batch_size: int = Field(16, ge=1, description="Rows per forward pass when scoring (ppo.score_batch_size); "
                                  "TRL's baseline scores all 64 at once (its local_rollout_forward_batch_size).")
    temperature: float = Field(0.7, gt=0, description="Sampling temperature (also in every log-prob).")
    learning_rate: float = Field(3e-6, gt=0, description="Optimizer learning rate.")
    kl_coef: float = Field(0.05, ge=0, description="Fixed beta of the k1 KL penalty.")
    cliprange: float = Field(0.2, gt=0, description="Policy clip range.")
    cliprange_value: float = Field(0.2, gt=0, description="Value clip range.")
    vf_coef: float = Field(0.1, ge=0, description="Value loss weight.")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights and activations.")
    device: str = Field("cpu", description="torch device of the four models, e.g. cpu or cuda.")
    critic: Literal["separate", "shared"] = Field("separate", description="Value model of its own (TRL's setup), "
                                                  "or a value head on the policy's backbone (ppo.critic=shared).")
    lora: bool = Field(False, description="Train LoRA adapters on the policy; the reference is the policy with "
                       "adapters off (ppo.lora).")
    peak_tflops: float | None = Field(None, gt=0, description="Datasheet peak of the device for MFU (e.g. 989 for "
                                      "an H100/H200 in dense bf16); without it MFU is against the measured roofline.")


def ppo_config(c: BenchPPOConfig) -> PPOConfig:
    """Our PPO settings for the TRL baseline's: fixed KL coefficient, whitened advantages, no entropy bonus."""
    return PPOConfig(
        iterations=c.iterations, batch_size=c.rollout_batch_size, max_new_tokens=c.response_length,
        temperature=c.temperature, epochs=c.num_ppo_epochs, minibatches=c.num_mini_batches, lr=c.learning_rate,
        clip_eps=c.cliprange, value_clip=c.cliprange_value, vf_coef=c.vf_coef, ent_coef=0.0, gamma=c.gamma,
        lam=c.lam, kl_coef=c.kl_coef, kl_estimator="k1", adaptive_kl=False, whiten_advantages=True,
        max_grad_norm=1e9,  # TRL's PPO loop never clips (the norm is still computed: a few ms)
        seed=c.seed, stop_at_eos=False, rm_offset_samples=0,  # TRL: no stop token, no RM normalisation
        critic=c.critic, lora=c.lora, lr_schedule="constant", score_batch_size=c.score_batch_size,
    )


def build_tokenizer(c: BenchPPOConfig, corpus: list[str]):
    """BPE (Metaspace) trained on the synthetic corpus, as TRL's baseline does, with EOS and PAD given the ids
    just past the model's vocabulary: the policy can never sample them, so every response runs all
    `response_length` tokens, all real (TRL: `stop_token=None`, `pad_outside_vocab`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    size = min(c.vocab_size, 1024)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=size, special_tokens=["[UNK]"], show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    # EOS and PAD outside the vocabulary, as TRL's baseline: no response ever ends early (ppo.stop_at_eos=false
    # would give the same work, but an in-vocabulary EOS would then change the masks the update sees).
    fast.add_special_tokens({"eos_token": "[EOS]", "pad_token": "[PAD]"})  # ids size, size + 1
    return fast


def make_prompts(c: BenchPPOConfig) -> tuple[object, list[str]]:
    """A seeded Zipf corpus of random words (TRL baseline's recipe); prompts are sentences of >= P tokens, of
    which the trainer keeps the last P."""
    rng = np.random.default_rng(c.seed)
    lexicon = sorted({"".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(2, 9)))
                      for _ in range(3000)})
    weights = 1.0 / (1.0 + rng.permutation(len(lexicon)))
    weights /= weights.sum()
    corpus = [" ".join(rng.choice(lexicon, size=int(rng.integers(24, 48)), p=weights)) for _ in range(4000)]
    tokenizer = build_tokenizer(c, corpus)
    prompts = [s for s in corpus if len(tokenizer(s, add_special_tokens=False)["input_ids"]) >= c.prompt_length]
    if len(prompts) < c.num_prompts:
        raise ValueError(f"only {len(prompts)} synthetic prompts have {c.prompt_length} tokens")
    return tokenizer, prompts[: c.num_prompts]


def build_models(c: BenchPPOConfig, tokenizer) -> PPOModels:
    """Policy, reference (a copy of the initial policy), value and reward models: random-init GPT-2 of the same
    size, as TRL's baseline builds them (seeds seed, seed + 1, seed + 2; no dropout)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        GPT2Config,
    )

    def config(**extra) -> GPT2Config:
        return GPT2Config(vocab_size=c.vocab_size, n_positions=c.n_positions, n_embd=c.n_embd, n_layer=c.n_layer,
                          n_head=c.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          activation_function=c.activation_function, bos_token_id=None, eos_token_id=None, **extra)

    kw = dict(attn_implementation=c.attn_implementation, dtype=getattr(torch, c.dtype))
    torch.manual_seed(c.seed)
    policy = AutoModelForCausalLM.from_config(config(), **kw)
    ref = copy.deepcopy(policy)
    torch.manual_seed(c.seed + 1)
    value = AutoModelForSequenceClassification.from_config(config(num_labels=1), **kw) if c.critic == "separate" \
        else None
    torch.manual_seed(c.seed + 2)
    reward = AutoModelForSequenceClassification.from_config(config(num_labels=1), **kw)
    models = [m if m is None else m.to(device=c.device, dtype=getattr(torch, c.dtype)).eval()
              for m in (policy, None if c.lora else ref, reward, value)]
    return PPOModels(*models, tokenizer=tokenizer)


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
    """`trainer.step()`, phase by phase, with a device sync after each so that phase times are honest on a GPU."""
    cpu0, busy0, t0 = time.process_time(), machine_busy_s(), time.perf_counter()
    ro = trainer.rollout()
    _sync(device)
    t1 = time.perf_counter()
    trainer.score(ro)
    trainer.advantages(ro)
    _sync(device)
    t2 = time.perf_counter()
    trainer.update(ro)
    _sync(device)
    t3 = time.perf_counter()
    if ro.response.shape[1] != trainer.cfg.max_new_tokens or not bool(ro.response_mask.all()):
        raise RuntimeError("a response stopped early: the benchmark needs every token sampled")
    cpu = time.process_time() - cpu0
    t4 = time.perf_counter()
    return {"total_s": t4 - t0, "generate_s": t1 - t0, "rollout_score_s": t2 - t1, "update_s": t3 - t2,
            "other_s": t4 - t3, "cpu_s": cpu, "foreign_cpu_s": max(0.0, machine_busy_s() - busy0 - cpu),
            "peak_rss_mib": peak_rss_mib()}


def run(c: BenchPPOConfig, on_iteration=None) -> dict:
    """Build everything, run `c.iterations` PPO iterations, return the summary (TRL's key names where shared)."""
    configure_process(c.torch_threads)
    if c.prompt_length + c.response_length > c.n_positions:
        raise ValueError("prompt_length + response_length must be <= n_positions")
    t_setup = time.perf_counter()
    tokenizer, prompts = make_prompts(c)
    models = build_models(c, tokenizer)
    trainer = PPOTrainer(models, prompts, ppo_config(c), max_prompt_tokens=c.prompt_length)
    rss_after_models = peak_rss_mib()
    setup_s = time.perf_counter() - t_setup
    if c.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    iters = []
    for i in range(c.iterations):
        iters.append(_iteration(trainer, c.device))
        if on_iteration:
            on_iteration(i + 1, iters[-1])
    dtype = getattr(torch, c.dtype)
    roofline = matmul_roofline(c.device, dtype)
    return summarize(c, iters, roofline, rss_after_models_mib=rss_after_models, setup_s=setup_s)


def summarize(c: BenchPPOConfig, iters: list[dict], roofline_gflops: float, **extra) -> dict:
    meas = iters[c.warmup_iterations:] or iters

    def med(key, rows=meas):
        return statistics.median(r[key] for r in rows) if rows else None

    tot = [r["total_s"] for r in meas]
    quiet = [r for r in meas if r["foreign_cpu_s"] < 0.1 * r["total_s"]]
    shape = Shape(c.n_layer, c.n_embd, c.vocab_size)
    flops = ppo_iteration_flops(shape, shape, shape, c.rollout_batch_size, c.prompt_length, c.response_length,
                                c.num_ppo_epochs, shared_critic=c.critic == "shared")
    toks = c.rollout_batch_size * c.response_length
    phase = {"generate": med("generate_s"), "score": med("rollout_score_s"), "update": med("update_s")}
    peak = (c.peak_tflops * 1e3) if c.peak_tflops else roofline_gflops
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
        "other_s_median": round(med("other_s"), 4), "gc_s_median": 0.0,
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
        "mfu_reference": "peak_tflops" if c.peak_tflops else "measured matmul roofline",
        "optimizer_steps_per_iter": c.num_ppo_epochs * c.num_mini_batches,
        **{k: round(v, 2) for k, v in extra.items()},
        "config": c.model_dump(),
    }
    if c.device.startswith("cuda"):
        out["peak_gpu_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out
