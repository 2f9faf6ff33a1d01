"""Memory estimate of each stage on one device, and the preflight that refuses a config that cannot fit.

Sizes come from the models' configs on the `meta` device (`rlhf_lib.shapes`): nothing is downloaded or allocated.
In bytes, per stage:

    total = weights + gradients + Adam + activations of the peak phase + runtime reserve

- weights: params x bytes(dtype) of every model the stage holds; trained models in model.dtype, PPO's frozen
  reference and reward model in resources.frozen_dtype. With ppo.lora there is no reference copy.
- gradients: trainable params x bytes(their dtype) (LoRA adapters are float32, peft's default).
- Adam: two moments per trainable parameter in its dtype (torch's fused Adam(W) keeps nothing else that size).
- activations: phases run one after another (sampling, a scoring forward, a training pass), so the peak phase
  counts; the formulas are on `rlhf_lib.shapes` (`trained_activations`, `forward_activations`, `logits_bytes`,
  `kv_cache_bytes`).
- autocast (resources.mixed_precision) caches a 16-bit copy of each trained float32 weight while a training pass
  runs: counted in that pass's phase.
- runtime: on a GPU, `RUNTIME_RESERVE` for the CUDA context and the allocator's slack; on a CPU (the estimate is
  then of the process's resident memory), `CPU_PROCESS_BASE` for the interpreter and its libraries (torch,
  transformers, Prefect, MLflow: 0.52 GiB measured after importing the stages), and in each training phase
  `CPU_HEAP_SLACK` of its activations for what glibc keeps of earlier steps' freed ones.

Assumptions: every process holds whole models (DDP, as the stages launch; FSDP/DeepSpeed would shard them); rows run
at full length (prompt + response = model.n_positions); a loaded checkpoint's vocabulary is not resized (GPT-2 gets
one PAD row more: H parameters); attention runs as SDPA on a GPU (no T x T scores kept). "GB" here are GiB, the unit of GPU names: an "80 GB" A100 has 80 GiB.

Over 300 lines because the estimate of every stage shares one model of bytes (weights, gradients, Adam,
activations, runtime reserve); split, each stage's rule would lose the terms it shares with the others.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from rlhf_lib.config import ConfigError, PipelineConfig, ResourcesConfig
from rlhf_lib.config.ppo import COMPILED_GRAPHS, COMPILED_PROMPT_BUCKET
from rlhf_lib.shapes import (
    DTYPE_BYTES,
    Arch,
    Models,
    forward_activations,
    kv_cache_bytes,
    logits_bytes,
    resolve_models,
    trained_activations,
)

GiB = 2**30
RUNTIME_RESERVE = GiB
CPU_PROCESS_BASE = int(0.6 * GiB)
# (rows, positions, V) float32 tensors alive with a chunk of logits. Training: the logits, their float32 / temperature
# copy, the softmax that logsumexp and the entropy keep, their gradient. Scoring: the logits, the scaled copy,
# logsumexp's exp.
LOGIT_COPIES_TRAIN, LOGIT_COPIES_INFER = 4, 3
# On a CPU the process's resident memory also holds what glibc's allocator keeps of the activations earlier training
# steps freed: fragments of its heaps that it cannot return, and that the next step's tensors of other sizes cannot
# reuse; the share grows with the steps (smollm2-hh's reward stage peaked at 8.8 GiB after 8 steps, 12.2 GiB after
# its 40; with MALLOC_MMAP_THRESHOLD_=1048576, which returns every block of 1 MiB or more when freed, 9.8 GiB and 26 %
# more time). Counted as 0.75 of a step's activations in every training phase on a CPU, fitted on smollm2-hh's stages,
# each in its own process with its whole budget (SFT, RM and PPO within 15 %: benchmarks/RESULTS.md); logits are left
# out (blocks that large are mmapped and returned when freed).
CPU_HEAP_SLACK = 0.75
TRAINING_PHASES = ("training step", "update: policy", "update: value model", "update: ptx")
STAGES = ("sft", "reward", "ppo", "eval", "dpo")
Kind = Literal["weights", "grads", "adam", "activations", "runtime"]
KINDS: tuple[Kind, ...] = ("weights", "grads", "adam", "activations", "runtime")
Phases = dict[str, list["Component"]]


class MemoryBudgetError(ConfigError):
    """A stage needs more memory than one device has; the message names its largest parts and the config keys that
    shrink each."""


@dataclass(frozen=True)
class Component:
    kind: Kind
    name: str
    bytes: int
    keys: tuple[str, ...] = ()  # config keys that shrink it


@dataclass(frozen=True)
class Estimate:
    """One stage's memory: the parts that stay (weights, gradients, Adam, runtime) and the activations of its peak
    phase. `phases` holds every phase's activation bytes; `params` every model's parameter count."""

    stage: str
    components: tuple[Component, ...]
    params: dict[str, int]
    phases: dict[str, int]
    peak_phase: str

    @property
    def total(self) -> int:
        return sum(c.bytes for c in self.components)

    def by_kind(self) -> dict[str, int]:
        return {k: sum(c.bytes for c in self.components if c.kind == k) for k in KINDS}

    def largest(self, n: int = 4) -> list[Component]:
        """The `n` largest parts that a config key can shrink (not the fixed runtime reserve)."""
        return sorted((c for c in self.components if c.kind != "runtime"), key=lambda c: -c.bytes)[:n]

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "total_bytes": self.total, "by_kind": self.by_kind(), "params": self.params,
                "phases": self.phases, "peak_phase": self.peak_phase,
                "components": [asdict(c) for c in self.components]}


def _act(name: str, nbytes: int, *keys: str) -> Component:
    return Component("activations", name, nbytes, keys)


def _if(flag: bool, *keys: str) -> tuple[str, ...]:
    return keys if flag else ()


def _cap(length: int, a: Arch) -> int:
    return min(length, a.max_positions or length)


def _trained(name: str, params: int, nbytes: int, keys: tuple[str, ...]) -> list[Component]:
    """Gradients and Adam's two moments of `params` trainable parameters of `nbytes` each."""
    return [Component("grads", name, params * nbytes, keys), Component("adam", name, 2 * params * nbytes, keys)]


def _ppo_static(cfg: PipelineConfig, ms: Models) -> list[Component]:
    """Policy, reference (none with LoRA), RM and value model weights; gradients and Adam of what trains."""
    c, r, p, v = cfg.ppo, cfg.resources, ms.policy, ms.value
    tb, fb = DTYPE_BYTES[ms.dtype], DTYPE_BYTES[r.frozen_dtype]
    half = _if(ms.dtype == "float32", "model.dtype=bfloat16")
    frozen = _if(r.frozen_dtype == "float32", "resources.frozen_dtype=bfloat16")
    critic = ("ppo.critic=shared or ppo.advantage_estimator=grpo",)
    head = p.hidden + 1 if c.has_critic and c.critic == "shared" else 0  # a value head on the policy
    out = [Component("weights", "policy", p.params * tb, half)]
    if c.lora:
        out += [Component("weights", "policy LoRA adapters", p.lora_params * 4, ("ppo.lora_r",)),
                *_trained("policy", p.lora_params, 4, ("ppo.lora_r",)), *_trained("value head", head, tb, ())]
    else:
        out += [Component("weights", "reference", p.params * fb, frozen + ("ppo.lora",)),
                *_trained("policy", p.params + head, tb, ("ppo.lora",) + half)]
    if c.reward_model is not None:  # function, judge, http or environment sources alone load no RM
        out.append(Component("weights", "reward model", ms.reward.params * fb, frozen))
    if c.has_critic and c.critic == "separate":
        out += [Component("weights", "value model", v.params * tb, critic), *_trained("value model", v.params, tb, critic)]
    if r.num_processes > 1:
        grads = sum(x.bytes for x in out if x.kind == "grads")
        out.append(Component("grads", "DDP gradient buckets", grads, ("resources.num_processes=1",)))
    if s := c.async_rollouts.staleness:  # the sampler thread's policy, and the trained weights' copies in flight
        off = ("ppo.async_rollouts.staleness=0",)
        trained = p.lora_params * 4 if c.lora else p.params * tb
        out += [Component("weights", "async sampler's policy copy", p.params * tb + (trained if c.lora else 0), off),
                Component("weights", "async weight copies in flight", s * trained, off)]
    return out


def _sampling_cache(cfg: PipelineConfig, a: Arch, rows: int, t: int, act: int) -> int:
    """Sampling's KV cache. ppo.rollout_engine=compiled rounds prompt widths up to a bucket (its static cache is
    allocated at the rounded width: up to a bucket - 1 positions of left padding) and keeps the caches of its last
    two graphs (`rlhf_lib.lm.compiled.MAX_GRAPHS`, e.g. two width buckets)."""
    if cfg.ppo.rollout_engine != "compiled":
        return kv_cache_bytes(a, rows, t, act)
    return COMPILED_GRAPHS * kv_cache_bytes(a, rows, t + COMPILED_PROMPT_BUCKET - 1, act)


def _ppo_phases(cfg: PipelineConfig, ms: Models) -> Phases:
    """1. sampling (KV cache), 2. scoring (reference, values, RM forwards of ppo.score_batch_size rows), 5. update
    (the policy's and the value model's forward + backward over one micro-batch, one after the other; ptx)."""
    c, r, p, v = cfg.ppo, cfg.resources, ms.policy, ms.value
    tb, fb, n = DTYPE_BYTES[ms.dtype], DTYPE_BYTES[r.frozen_dtype], r.num_processes
    act_t, act_f = (2, 2) if r.mixed_precision != "no" else (tb, fb)
    t = _cap(cfg.model.n_positions, p)
    resp = min(c.response_tokens, t - 1)  # a multi-turn episode: its whole budget
    chunk, rows = min(c.logprob_chunk or resp, resp), math.ceil(c.batch_size / n)
    s_rows = min(c.score_batch_size, rows)
    phases = {
        "sampling": [
            _act("sampling KV cache", _sampling_cache(cfg, p, rows, t, act_t), "ppo.batch_size", "resources.num_processes",
                 "model.n_positions"),
            _act("sampling prompt forward", forward_activations(p, rows * (t - resp), act_t), "ppo.batch_size"),
            _act("sampling logits", logits_bytes(rows, 1, p.vocab, LOGIT_COPIES_INFER))],
        "score: reference": [
            # The chunked path reads the final states from `output_hidden_states`: every layer's is kept.
            _act("reference forward", forward_activations(p, s_rows * t, act_t if c.lora else act_f,
                                                          p.layers + 1 if c.logprob_chunk else 1),
                 "ppo.score_batch_size"),
            _act("reference logits", logits_bytes(s_rows, chunk, p.vocab, LOGIT_COPIES_INFER), "ppo.logprob_chunk",
                 "ppo.score_batch_size")],
    }
    if c.reward_model is not None:
        phases["score: reward model"] = [_act("reward model forward", forward_activations(
            ms.reward, s_rows * _cap(cfg.model.n_positions, ms.reward), act_f), "ppo.score_batch_size")]
    separate = c.has_critic and c.critic == "separate"
    if c.has_critic:
        phases["score: values"] = [_act("value forward", forward_activations(v if separate else p, s_rows * t, act_t),
                                        "ppo.score_batch_size")]
    mb_rows = max(1, c.batch_size // c.minibatches // n)
    tokens = (min(max(c.micro_batch_tokens, t), mb_rows * t) if c.micro_batch_tokens
              else max(1, mb_rows // c.gradient_accumulation_steps) * t)
    micro = ("ppo.micro_batch_tokens / ppo.gradient_accumulation_steps", "resources.num_processes")
    ckpt, gc = _if(not c.gradient_checkpointing, "ppo.gradient_checkpointing"), c.gradient_checkpointing
    copies = r.mixed_precision != "no" and tb == 4  # autocast caches a bf16 copy of each trained fp32 weight
    phases["update: policy"] = [
        _act("policy activations", trained_activations(p, tokens, act_t, tb, gc), *micro, *ckpt),
        _act("policy logits", logits_bytes(max(1, tokens // t), chunk, p.vocab, LOGIT_COPIES_TRAIN),
             "ppo.logprob_chunk", *micro),
        _act("autocast policy copy", 2 * p.params * (copies and not c.lora), "resources.mixed_precision=no")]
    if separate:
        phases["update: value model"] = [
            _act("value model activations", trained_activations(v, tokens, act_t, tb, gc), *micro, *ckpt),
            _act("autocast value copy", 2 * v.params * copies, "resources.mixed_precision=no")]
    if c.ptx_coef > 0:
        ptx_rows, ptx_len = math.ceil(c.ptx_batch_size / n), _cap(cfg.sft.max_length, p)
        keys = ("ppo.ptx_batch_size", "sft.max_length")
        phases["update: ptx"] = [
            _act("ptx activations", trained_activations(p, ptx_rows * ptx_len, act_t, tb, gc), *keys, *ckpt),
            _act("ptx logits", logits_bytes(ptx_rows, ptx_len, p.vocab, LOGIT_COPIES_TRAIN), *keys)]
    if c.async_rollouts.staleness:  # the sampler thread's phase runs beside each of the trainer's
        beside = [replace(x, name=f"{x.name} (async, beside)", keys=x.keys + ("ppo.async_rollouts.staleness=0",))
                  for x in phases["sampling"]]
        phases = {k: v if k == "sampling" else [*v, *beside] for k, v in phases.items()}
    return phases


def _supervised(cfg: PipelineConfig, ms: Models, stage: str) -> tuple[list[Component], Phases]:
    """SFT (the policy, (B, T, V) logits) or reward-model training (K responses per ranked list, a scalar head)."""
    r, sft = cfg.resources, stage == "sft"
    a, s, dtype = (ms.policy, cfg.sft, ms.dtype) if sft else (ms.reward, cfg.reward, ms.reward_dtype)
    tb = DTYPE_BYTES[dtype]
    act = 2 if r.mixed_precision != "no" else tb
    name, half = ("policy" if sft else "reward model"), _if(dtype == "float32", "model.dtype=bfloat16")
    static = [Component("weights", name, a.params * tb, half), *_trained(name, a.params, tb, half)]
    if r.num_processes > 1:
        static.append(Component("grads", "DDP gradient buckets", a.params * tb, ("resources.num_processes=1",)))
    t = _cap(s.max_length, a)
    # Pairs for user data in a pair format (and `auto`: most user data is pairs); K for the built-in tasks and
    # ranked or scored user data (data.responses_per_list: set it to the data's largest K).
    pairs = cfg.data.user_data and cfg.data.preferences_format not in ("ranked", "scored")
    per_list = 2 if pairs else cfg.data.responses_per_list
    rows = math.ceil(s.batch_size / r.num_processes) * (1 if sft else per_list)
    keys = (f"{stage}.batch_size", f"{stage}.max_length", "resources.num_processes")
    step = [_act(f"{name} activations", trained_activations(a, rows * t, act, tb, r.gradient_checkpointing), *keys,
                 *_if(not r.gradient_checkpointing, "resources.gradient_checkpointing")),
            _act("autocast copy", 2 * a.params * (r.mixed_precision != "no" and tb == 4), "resources.mixed_precision=no")]
    if sft:
        return static, {"training step": [*step, _act("logits", logits_bytes(rows, t, a.vocab, LOGIT_COPIES_TRAIN),
                                                      *keys[:2])]}
    held_out = [_act("reward model forward", forward_activations(a, cfg.reward.eval_batch_size * t, act),
                     "reward.eval_batch_size")]
    return static, {"training step": step, "held-out accuracy": held_out}


def _dpo(cfg: PipelineConfig, ms: Models) -> tuple[list[Component], Phases]:
    """DPO (`rlhf_lib.dpo`): the policy trained on pairs, each step a chosen and a rejected row per pair, (B, T, V)
    logits; the reference's log-probs come from one pass of the SFT model before training (no reference copy kept),
    as do the held-out pairs' before and after, `dpo.eval_batch_size` pairs at a time."""
    r, d, a = cfg.resources, cfg.dpo, ms.policy
    tb = DTYPE_BYTES[ms.dtype]
    act = 2 if r.mixed_precision != "no" else tb
    half = _if(ms.dtype == "float32", "model.dtype=bfloat16")
    static = [Component("weights", "policy", a.params * tb, half), *_trained("policy", a.params, tb, half)]
    if r.num_processes > 1:
        static.append(Component("grads", "DDP gradient buckets", a.params * tb, ("resources.num_processes=1",)))
    t = _cap(d.max_length, a)
    rows = 2 * math.ceil(d.batch_size / r.num_processes)  # chosen and rejected of each pair
    keys = ("dpo.batch_size", "dpo.max_length", "resources.num_processes")
    step = [_act("policy activations", trained_activations(a, rows * t, act, tb, r.gradient_checkpointing), *keys,
                 *_if(not r.gradient_checkpointing, "resources.gradient_checkpointing")),
            _act("logits", logits_bytes(rows, t, a.vocab, LOGIT_COPIES_TRAIN), *keys[:2]),
            _act("autocast copy", 2 * a.params * (r.mixed_precision != "no" and tb == 4), "resources.mixed_precision=no")]
    scored = 2 * d.eval_batch_size
    log_probs = [_act("forward", forward_activations(a, scored * t, act), "dpo.eval_batch_size"),
                 _act("logits", logits_bytes(scored, t, a.vocab, LOGIT_COPIES_INFER), "dpo.eval_batch_size")]
    return static, {"training step": step, "reference log-probs": log_probs}


def _eval(cfg: PipelineConfig, ms: Models) -> tuple[list[Component], Phases]:
    """The PPO policy and the SFT model sampled on held-out prompts, the KL between them (logits of
    `ppo.logprob_chunk` response positions at a time), RM scores; no gradients."""
    p, e, tb, rb = ms.policy, cfg.eval, DTYPE_BYTES[ms.dtype], DTYPE_BYTES[ms.reward_dtype]
    act = 2 if cfg.resources.mixed_precision != "no" else tb
    half = _if(ms.dtype == "float32", "model.dtype=bfloat16")
    rm = cfg.ppo.reward_model is not None
    static = [Component("weights", "policy", p.params * tb, half), Component("weights", "SFT model", p.params * tb, half),
              Component("weights", "reward model", ms.reward.params * rb * rm, half)]
    t = _cap(cfg.model.n_positions, p)
    resp, rows = min(e.max_new_tokens, t - 1), e.batch_size
    phases = {
        "sampling": [_act("sampling KV cache", _sampling_cache(cfg, p, rows, t, act), "eval.batch_size",
                          "model.n_positions"),
                     _act("sampling prompt forward", forward_activations(p, rows * (t - resp), act), "eval.batch_size"),
                     _act("sampling logits", logits_bytes(rows, 1, p.vocab, LOGIT_COPIES_INFER))],
        "KL to the SFT model": [
            _act("SFT forward", forward_activations(p, rows * t, act), "eval.batch_size"),
            _act("SFT logits", logits_bytes(rows, min(resp, cfg.ppo.logprob_chunk or resp), p.vocab,
                                            LOGIT_COPIES_INFER), "eval.batch_size", "ppo.logprob_chunk")],
        "reward scores": [_act("reward model forward", forward_activations(
            ms.reward, rows * _cap(cfg.model.n_positions, ms.reward), act), "eval.batch_size")],
        "held-out accuracy": [_act("reward model forward", forward_activations(
            ms.reward, cfg.reward.eval_batch_size * _cap(cfg.reward.max_length, ms.reward), act),
            "reward.eval_batch_size")],
    }
    if not rm:  # the reward came from functions, judges, endpoints or an environment: no RM forward
        del phases["reward scores"], phases["held-out accuracy"]
    return static, phases


def planned_stages(cfg: PipelineConfig) -> tuple[str, ...]:
    """The stages of STAGES that train or load models under `cfg`: no reward stage without a reward source of kind
    model (the pipeline skips it), no SFT stage with sft.max_steps 0 (it registers the pretrained weights), DPO only
    with `dpo.enabled`."""
    skipped = ({"reward"} if cfg.ppo.reward_model is None else set()) | (set() if cfg.dpo.enabled else {"dpo"})
    return tuple(s for s in STAGES if s not in skipped | ({"sft"} if cfg.sft.max_steps == 0 else set()))


def estimate(cfg: PipelineConfig, stage: str, models: Models | None = None) -> Estimate:
    """The memory `stage` (sft, reward, ppo, eval or dpo) needs on one device under `cfg`."""
    if stage not in STAGES:
        raise ValueError(f"no memory estimate for stage {stage!r}; expected one of {STAGES}")
    ms = models or resolve_models(cfg)
    if stage == "ppo":
        static, phases = _ppo_static(cfg, ms), _ppo_phases(cfg, ms)
    else:
        static, phases = (_eval(cfg, ms) if stage == "eval" else _dpo(cfg, ms) if stage == "dpo"
                          else _supervised(cfg, ms, stage))
    if on_cpu(cfg.resources):
        for name in TRAINING_PHASES:
            kept = sum(c.bytes for c in phases.get(name, []) if "logits" not in c.name and "autocast" not in c.name)
            if kept:
                phases[name].append(_act("freed activations glibc keeps (CPU)", int(CPU_HEAP_SLACK * kept),
                                         *phases[name][0].keys))
    sums = {name: sum(c.bytes for c in comps) for name, comps in phases.items()}
    peak = max(sums, key=sums.__getitem__)
    runtime = (Component("runtime", "process: Python, torch, transformers, Prefect, MLflow", CPU_PROCESS_BASE)
               if on_cpu(cfg.resources) else Component("runtime", "CUDA context, allocator slack", RUNTIME_RESERVE))
    params = {"policy": ms.policy.params, "reward model": ms.reward.params, "value model": ms.value.params}
    return Estimate(stage, tuple(c for c in [*static, *phases[peak], runtime] if c.bytes > 0), params, sums, peak)


def human(n: float) -> str:
    """Bytes in GB (GiB) from 0.1 GB on, else in MB (MiB)."""
    return f"{n / GiB:.2f} GB" if n >= GiB / 10 else f"{n / 2**20:.1f} MB"


def _refusal(est: Estimate, headline: str) -> MemoryBudgetError:
    lines = [f"{headline}. The largest parts of its estimate, and the config keys that shrink them:"]
    for c in est.largest():
        lines.append(f"  {c.kind} {c.name}: {human(c.bytes)}" + (f"  <- {', '.join(c.keys)}" if c.keys else ""))
    lines.append("`rlhf plan` with the same --preset/--config/--set prints every stage's estimate.")
    return MemoryBudgetError("\n".join(lines))


def check(est: Estimate, budget: int, where: str = "the device") -> None:
    """Raise `MemoryBudgetError` when `est` exceeds `budget` bytes, naming the largest parts and their keys."""
    if est.total > budget:
        raise _refusal(est, f"the {est.stage} stage needs about {human(est.total)} but {where} has {human(budget)}")


def out_of_memory(est: Estimate, error: BaseException) -> MemoryBudgetError:
    """What a stage raises (`from error`) when the device ran out of memory despite the preflight: torch's headline
    and the keys that shrink the stage's largest parts, as a refusal reads."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return _refusal(est, f"the {est.stage} stage ran out of device memory ({first}); its estimate was "
                         f"{human(est.total)}")


def one_process_note(estimates: list[Estimate], resources) -> str | None:
    """On a CPU, what a run of several stages in one process (`rlhf run full`) should plan for: glibc keeps the
    heaps an earlier stage fragmented, so a later stage starts from them (`system/start_rss_gb`). None on a GPU or
    for a single stage."""
    if len(estimates) < 2 or not on_cpu(resources):
        return None
    top = max(estimates, key=lambda e: e.total)
    return (f"one process (`rlhf run full` on a CPU): plan for the largest stage, {human(top.total)} ({top.stage}), "
            "for every stage after it too: what glibc kept of an earlier stage's heap stays in the process (smollm2-hh: "
            "PPO peaked at 12.5 GiB after the reward stage, 8.2 GiB in its own process). `rlhf run STAGE` one stage "
            "at a time gives each stage its own figure.")


def on_cpu(resources: ResourcesConfig) -> bool:
    """Whether the stages run on the CPU: resources.device=cpu, or auto without CUDA."""
    if resources.device == "cpu":
        return True
    if resources.device != "auto":
        return False
    import torch

    return not torch.cuda.is_available()


def device_budget(resources: ResourcesConfig, device: Any = None) -> tuple[int, str] | None:
    """(bytes, what they are) of one device: resources.memory_gb, else the total memory of the CUDA device
    (`device`, else resources.device); None on a CPU (no check)."""
    if resources.memory_gb is not None:
        return int(resources.memory_gb * GiB), f"resources.memory_gb ({resources.memory_gb:g})"
    import torch

    name = str(device if device is not None else resources.device)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(dev)
    return props.total_memory, f"{dev} ({props.name})"


def preflight(cfg: PipelineConfig, stage: str, device: Any = None) -> Estimate | None:
    """The estimate of `stage`, checked against one device's memory (see `device_budget`) before anything loads.
    Raises `MemoryBudgetError` (a `ConfigError`) when it does not fit. None, and nothing estimated, where there is
    no budget to check (the CPU without `resources.memory_gb`)."""
    if (budget := device_budget(cfg.resources, device)) is None:
        return None
    est = estimate(cfg, stage)
    check(est, *budget)
    return est
