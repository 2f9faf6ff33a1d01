"""Time estimate of each stage for `rlhf plan`: its FLOPs (`benchmarks.flops`, from the config and, where the data
and the policy's tokenizer are on this machine, the data's real token counts) over a matmul roofline measured in
this process, times the share of that roofline each kind of work reaches.

    seconds = sum over the stage's work of  FLOPs(work) / (roofline x EFFICIENCY[kind of work])

Kinds: `train` (forward + backward + optimizer: SFT, the RM, PPO's update), `forward` (no autograd: PPO's scoring,
the RM's held-out accuracy, the eval's log-probs and scores) and `sample` (token-by-token decoding with a KV cache:
memory-bound, the lowest share). The shares are measured, not assumed: `EFFICIENCY` holds what
`rlhf run full --preset smollm2-hh` reached on a 2-core AMD EPYC with avx512_bf16 (bf16 autocast, a 440 GFLOP/s bf16
matmul roofline) in its SFT stage (train) and PPO's scoring and sampling phases; the reward and eval stages are the
check (benchmarks/RESULTS.md sets the estimate against every stage's measured time). A GPU reaches other shares:
the estimate is for CPUs until measured there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.flops import Shape, attention_flops, body_flops, causal_keys, forward_flops, generate_flops
from rlhf_lib.config import PipelineConfig
from rlhf_lib.training import n_batches

# Share of the measured matmul roofline reached by each kind of work (see the module docstring).
EFFICIENCY = {"train": 0.30, "forward": 0.21, "sample": 0.07}


@dataclass(frozen=True)
class Lengths:
    """Rows and mean token counts (after the stages' cuts) of what each stage reads. `source` says where they come
    from: "data" (the user's files, rendered and tokenized as the data stage does) or "caps" (every row at the
    configured length: an upper bound)."""

    source: str
    sft_rows: int
    sft_tokens: float
    lists: int
    rm_prompt: float
    rm_response: float
    heldout_pairs: int
    ppo_prompt: float
    eval_prompts: int


def _mean(xs: list[int]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def lengths_from_caps(cfg: PipelineConfig) -> Lengths:
    """Every row at its cap: SFT and RM rows of max_length tokens (an RM row's prompt half of it), prompts of
    n_positions - max_new_tokens; row counts from data.max_rows or the demo task's sizes."""
    d = cfg.data
    rows = d.max_rows or d.n_train_prompts
    prompt = cfg.model.n_positions - cfg.ppo.max_new_tokens
    eval_prompts = cfg.eval.max_prompts or (d.max_rows or d.n_eval_prompts)
    return Lengths("caps", rows * (1 if d.user_data else d.sft_per_prompt), cfg.sft.max_length, rows,
                   cfg.reward.max_length / 2, cfg.reward.max_length / 2, d.max_rows or d.n_eval_prompts, prompt,
                   eval_prompts)


def lengths_from_data(cfg: PipelineConfig, tokenizer) -> Lengths:
    """The token counts of the user's data as the stages see them: read and rendered by the data stage's code
    (`build_user_task`, through the chat template when `data.render` says so), cut as each stage cuts."""
    from rlhf_lib.data.chat import Renderer
    from rlhf_lib.data.collate import cuts
    from rlhf_lib.data.user import build_user_task

    task = build_user_task(cfg.data, Renderer(lambda: tokenizer, cfg.data.render))

    def n(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def cut_row(prompt: int, response: int, max_length: int) -> tuple[int, int]:
        cp, cr = cuts(prompt, response, max_length)
        return prompt - cp, response - cr

    sft = [sum(cut_row(n(e.prompt), n(e.response) + 1, cfg.sft.max_length)) for e in task.records["sft"]]
    rm = [cut_row(n(ex.prompt), n(r) + 1, cfg.reward.max_length) for ex in task.records["preferences"]
          for r in ex.responses]
    max_prompt = cfg.model.n_positions - cfg.ppo.max_new_tokens
    ppo = [min(n(p.prompt), max_prompt) for p in task.records["prompts_train"]]
    n_eval = len(task.records["prompts_eval"])
    return Lengths("data", len(sft), _mean(sft), len(task.records["preferences"]), _mean([p for p, _ in rm]),
                   _mean([r for _, r in rm]), len(task.records["eval_pairs"]), _mean(ppo),
                   min(n_eval, cfg.eval.max_prompts or n_eval))


def local_tokenizer(cfg: PipelineConfig):
    """The policy's tokenizer when it is on this machine without a download or an import (a model folder, or a
    `.gguf`/known model imported before); None otherwise."""
    from pathlib import Path

    name = cfg.model.name_or_path
    if not name:
        return None
    from stages.models_io import imported_dir

    try:
        folder = imported_dir(name) or Path(name).expanduser()
    except ValueError:
        return None
    if not folder.is_dir():
        return None
    from rlhf_lib.models import load_tokenizer

    return load_tokenizer(folder, trust_remote_code=cfg.model.trust_remote_code)


SAMPLE_ROWS = 512


def local_data(cfg: PipelineConfig) -> bool:
    """Whether every configured user data source is a local file or folder (a hub data set would be downloaded)."""
    from rlhf_lib.data.sources import Source

    d = cfg.data
    specs = [getattr(d, k) for k in ("preferences", "eval_preferences", "sft", "prompts", "eval_prompts")]
    return d.user_data and all(Source(s).kind != "hub" for s in specs if s)


def lengths(cfg: PipelineConfig) -> Lengths:
    """`lengths_from_data` where the user's data is local and the policy's tokenizer is here, on at most
    `SAMPLE_ROWS` rows of each source (`data.max_rows` when smaller; the row counts are then those of the sample,
    so a larger data set is only right in its mean lengths), else `lengths_from_caps`."""
    if local_data(cfg) and (tokenizer := local_tokenizer(cfg)) is not None:
        sample = cfg.model_copy(update={"data": cfg.data.model_copy(
            update={"max_rows": min(cfg.data.max_rows or SAMPLE_ROWS, SAMPLE_ROWS)})})
        try:
            return lengths_from_data(sample, tokenizer)
        except (OSError, ValueError):  # a file the data stage would refuse: its error comes with the run
            pass
    return lengths_from_caps(cfg)


def list_size(cfg: PipelineConfig) -> int:
    """Responses per ranked list: data.responses_per_list for the built-in tasks and ranked or scored user data, 2
    for pairs (HH, standard, conversational, and `auto`, which most user data is)."""
    pairs = cfg.data.user_data and cfg.data.preferences_format not in ("ranked", "scored")
    return 2 if pairs else cfg.data.responses_per_list


def stage_flops(cfg: PipelineConfig, shape: Shape, rm: Shape, ln: Lengths) -> dict[str, dict[str, float]]:
    """{stage: {kind: FLOPs}} of the five stages under `cfg` (see the module docstring for the kinds)."""
    s, r, p, e = cfg.sft, cfg.reward, cfg.ppo, cfg.eval
    sft_rows = min(n_batches(ln.sft_rows, s.batch_size, s.epochs, s.max_steps) * s.batch_size, s.epochs * ln.sft_rows)
    t = round(ln.sft_tokens)
    out = {"sft": {"train": 3.0 * sft_rows * forward_flops(shape, 1, t, t)}}

    lists = min(n_batches(ln.lists, r.batch_size, r.epochs, r.max_steps) * r.batch_size, r.epochs * ln.lists)
    tp, tr = round(ln.rm_prompt), round(ln.rm_response)
    k = list_size(cfg)
    if r.share_prompts:  # the prompt once, each response on its cache
        per_list = (body_flops(rm, tp) + attention_flops(rm, causal_keys(tp))
                    + k * (body_flops(rm, tr) + attention_flops(rm, causal_keys(tr, past=tp))))
    else:
        per_list = k * (body_flops(rm, tp + tr) + attention_flops(rm, causal_keys(tp + tr)))
    # Held-out pairs: both responses on one prompt (`pair_scores`: the prompt once when shared).
    per_pair = (body_flops(rm, tp) + attention_flops(rm, causal_keys(tp))
                + 2 * (body_flops(rm, tr) + attention_flops(rm, causal_keys(tr, past=tp))) if r.share_prompts
                else 2 * (body_flops(rm, tp + tr) + attention_flops(rm, causal_keys(tp + tr))))
    heldout = ln.heldout_pairs * per_pair
    out["reward"] = {"train": 3.0 * lists * per_list, "forward": float(heldout)}

    prompt, new = round(ln.ppo_prompt), p.max_new_tokens
    gen = generate_flops(shape, p.batch_size, prompt, new)
    ref = forward_flops(shape, p.batch_size, prompt + new, new)
    scalar = 2 * p.batch_size * (body_flops(rm, prompt + new) + attention_flops(rm, causal_keys(prompt + new)))
    offset = p.rm_offset_samples and (generate_flops(shape, p.rm_offset_samples, prompt, new)
                                      + p.rm_offset_samples * body_flops(rm, prompt + new))
    out["ppo"] = {"sample": float(p.iterations * gen + offset), "forward": float(p.iterations * (ref + scalar)),
                  "train": float(p.iterations * p.epochs * 3 * (ref + scalar / 2))}

    rows = ln.eval_prompts
    # The eval samples SFT and policy (their log-probs come with the samples), takes the SFT model's log-probs of the
    # policy's responses (the KL) and scores both sides with the RM.
    out["eval"] = {"sample": float(2 * generate_flops(shape, rows, prompt, e.max_new_tokens)),
                   "forward": float(forward_flops(shape, rows, prompt + e.max_new_tokens, e.max_new_tokens)
                                    + 2 * rows * body_flops(rm, prompt + e.max_new_tokens))}
    # DPO: every pair of each ranked list, a chosen and a rejected row each; the reference's log-probs once before
    # training, the held-out pairs before and after.
    d = cfg.dpo
    pairs = ln.lists * k * (k - 1) // 2
    trained = min(n_batches(pairs, d.batch_size, d.epochs, d.max_steps) * d.batch_size, d.epochs * pairs)
    row = forward_flops(shape, 1, tp + tr, tp + tr)
    out["dpo"] = {"train": 3.0 * 2 * trained * row, "forward": float(2 * (pairs + 2 * ln.heldout_pairs) * row)}
    return out


def seconds(flops: dict[str, float], roofline_gflops: float) -> float:
    return sum(f / (roofline_gflops * 1e9 * EFFICIENCY[kind]) for kind, f in flops.items())


def roofline(cfg: PipelineConfig) -> tuple[float, str]:
    """(GFLOP/s, what) of a 1024 x 1024 matmul in the stages' compute dtype (bf16 under bf16 autocast) on the
    stages' device, with `torch_threads` threads."""
    import torch

    from benchmarks.ppo import matmul_roofline
    from rlhf_lib.memory import on_cpu

    device = "cpu" if on_cpu(cfg.resources) else ("cuda" if cfg.resources.device == "auto" else cfg.resources.device)
    dtype = torch.bfloat16 if cfg.resources.mixed_precision == "bf16" else torch.float32
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    try:
        value = matmul_roofline(device, dtype)
    finally:
        torch.set_num_threads(threads)
    return value, f"{str(dtype).removeprefix('torch.')} matmul on {device}, {cfg.torch_threads} threads"


def estimate_times(cfg: PipelineConfig, policy_config, reward_config) -> dict:
    """Each stage's estimated seconds with its FLOPs by kind, the roofline and where the token counts came from."""
    ln = lengths(cfg)
    work = stage_flops(cfg, Shape.of(policy_config), Shape.of(reward_config), ln)
    peak, what = roofline(cfg)
    return {"roofline_gflops": round(peak, 1), "roofline": what, "lengths": ln.source, "efficiency": EFFICIENCY,
            "stages": {stage: {"seconds": round(seconds(f, peak), 1),
                               "gflop": {k: round(v / 1e9, 1) for k, v in f.items()}}
                       for stage, f in work.items()},
            "token_counts": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in ln.__dict__.items()
                             if not math.isnan(v if isinstance(v, (int, float)) else 0)}}
