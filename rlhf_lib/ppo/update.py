"""5. update: N epochs x M minibatches of clipped-surrogate + clipped-value + entropy (+ ptx) steps over one rollout."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.data.collate import token_budget_split
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.lm.masked import masked_mean
from rlhf_lib.lm.scoring import Entropy
from rlhf_lib.ppo.critic import Critic
from rlhf_lib.ppo.losses import policy_loss, value_loss
from rlhf_lib.ppo.ptx import PtxBatches, ptx_share
from rlhf_lib.ppo.sharding import backward_share, summed
from rlhf_lib.ppo.types import Rollout

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel

Precision = Callable[[], contextlib.AbstractContextManager]  # the autocast context of the forward passes


def trim_padding(mb: Rollout) -> Rollout:
    """Drop columns that are padding in every row of a minibatch: leading query columns and trailing response
    columns. Results are unchanged (those positions are masked), and short minibatches cost less."""
    q_keep = mb.query_mask.bool().any(0).nonzero()
    q0 = int(q_keep[0]) if len(q_keep) else 0
    r_full, r_len = mb.response.shape[1], int(mb.response_mask.sum(1).max())
    trimmed = {
        name: v[:, :r_len]
        for name in mb.__dataclass_fields__
        if not name.startswith("query")  # per-token response fields: (B, R)
        and isinstance(v := getattr(mb, name), torch.Tensor) and v.dim() == 2 and v.shape[1] == r_full
    }
    return replace(mb, query=mb.query[:, q0:], query_mask=mb.query_mask[:, q0:], **trimmed)


def micro_batches(rollout: Rollout, rows: torch.Tensor, cfg: PPOConfig) -> list[torch.Tensor]:
    """This process's rows of a minibatch split into micro-batches: `gradient_accumulation_steps` equal parts, or
    packed by `micro_batch_tokens` (`token_budget_split` on prompt + response lengths)."""
    if cfg.micro_batch_tokens is None:
        micro = len(rows) // cfg.gradient_accumulation_steps
        return [rows[m0 : m0 + micro] for m0 in range(0, len(rows), micro)]
    q_len = rollout.query_mask[rows].sum(1).tolist()
    r_len = rollout.response_mask[rows].sum(1).tolist()
    widths = [int(q + r) for q, r in zip(q_len, r_len)]
    return [rows[torch.tensor(part)] for part in token_budget_split(widths, widths, cfg.micro_batch_tokens)]


def _micro_backward(policy: PreTrainedModel, critic: Critic, mb: Rollout, cfg: PPOConfig, train_policy: bool,
                    weight: float, backward: Callable[[torch.Tensor], None], entropy: Entropy = "grad",
                    precision: Precision = contextlib.nullcontext) -> tuple[float, dict[str, float]]:
    """Forward and backward of one micro-batch's loss, scaled by its share `weight` of the minibatch's real
    tokens, so that the micro-batches' gradients add up to exactly the gradient of the token-level mean over the
    whole minibatch. `backward` runs each backward pass (`sharding.backward_share`). Returns the scaled loss and
    stats.

    A separate value model shares no weight with the policy, so the policy's terms are backpropagated before the
    value model runs: the same gradients as one backward of the sum, with one model's activations alive at a time.
    Forward passes run inside `precision()` (autocast), backward passes outside it. `entropy`: as
    `Critic.forward` ("none": no entropy statistic from this micro-batch).

    The models read every response token (`response_mask`); the surrogate, the entropy and the value loss are means
    over the policy's own tokens (`policy_mask`: a multi-turn rollout's environment tokens are not actions).
    """
    seen, mask = mb.response_mask, mb.policy_mask
    separate = critic.kind == "separate"
    with precision():
        logprobs, ent_tokens, values = critic.forward(policy, mb.query, mb.query_mask, mb.response, seen,
                                                      cfg.temperature, train_policy, entropy=entropy,
                                                      with_values=not separate, chunk=cfg.logprob_chunk)
    loss = torch.zeros((), dtype=torch.float32, device=mask.device)
    stats: dict[str, float] = {}
    if logprobs is not None:
        pg, pg_stats = policy_loss(logprobs, mb.logprobs, mb.advantages, mask, cfg.clip_eps, mb.is_weights)
        loss = loss + pg
        stats.update(pg_stats)
        if ent_tokens is not None:
            ent = masked_mean(ent_tokens, mask)
            loss = loss - cfg.ent_coef * ent
            stats["entropy"] = float(ent.detach())
    done = 0.0  # the part of the loss already backpropagated
    if separate:
        if loss.requires_grad:  # the policy's terms first: their activations are freed before the value model runs
            backward(loss * weight)
            done, loss = float(loss.detach()), torch.zeros((), dtype=torch.float32, device=mask.device)
        with precision():
            values = critic.values(policy, mb.query, mb.query_mask, mb.response, seen)
    if values is not None:
        vf, vf_stats = value_loss(values, mb.values, mb.returns, mask, cfg.value_clip)
        loss = loss + cfg.vf_coef * vf
        stats.update(vf_stats)
    if loss.requires_grad:
        backward(loss * weight)
    return (done + float(loss.detach())) * weight, {k: v * weight for k, v in stats.items()}


def ppo_epochs(
    policy: PreTrainedModel,
    critic: Critic,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    cfg: PPOConfig,
    generator: torch.Generator,
    *,
    train_policy: bool = True,
    ptx_batch: PtxBatches | None = None,
    group: ProcessGroup | None = None,
    precision: Precision = contextlib.nullcontext,
) -> dict[str, float]:
    """Run `cfg.epochs` passes of `cfg.minibatches` minibatches over `rollout`; return the mean of each stat over
    the steps that have it, plus `refused_steps` (minibatches whose loss or gradient was not finite: skipped) and
    `epochs` (epochs run: fewer than cfg.epochs when the approximate-KL early stop fired).

    The entropy is a loss term only with `ent_coef > 0`; otherwise it is a statistic, computed without gradient in
    the first epoch only (the policy of the rollout, give or take the first epoch's steps), so the later epochs
    pay for no vocabulary softmax beyond the log-probs'. Forward passes run in `precision()` (autocast).

    Loss per minibatch (PPO eq. 9, signs as minimised; InstructGPT eq. 2 for the ptx term):
        L = L_clip(policy) + vf_coef * L_value_clipped - ent_coef * H(policy) + ptx_coef * L_sft(demos)
    `train_policy=False` (critic warm-up) keeps only the value term. Each minibatch is split into
    `cfg.gradient_accumulation_steps` micro-batches (or packed by `cfg.micro_batch_tokens`) whose gradients add up
    to the minibatch's. Under `accelerate
    launch` (`group`, see `rlhf_lib.ppo.sharding`) each process computes its slice of every minibatch, and the
    statistics and decisions (NaN guard, early stop) use their sums over processes.
    """
    group = group or ProcessGroup(device="cpu")
    backward = partial(backward_share, group)
    rollout.require("advantages")
    if critic.trains:
        rollout.require("values", "returns")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    groups = {g.get("name", str(i)): g["params"] for i, g in enumerate(optimizer.param_groups)}
    b_size = rollout.batch_size
    mb_size = b_size // cfg.minibatches
    use_ptx = ptx_batch is not None and cfg.ptx_coef > 0 and train_policy
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    n = epochs_run = 0
    stop = False
    policy.train()
    critic.module.train()
    for epoch in range(cfg.epochs):
        epochs_run += 1
        entropy: Entropy = "grad" if cfg.ent_coef > 0 else ("detached" if epoch == 0 else "none")
        b_perm = torch.randperm(b_size, generator=generator)
        for start in range(0, b_size, mb_size):
            mb_idx = b_perm[start : start + mb_size]
            mb_tokens = float(rollout.policy_mask[mb_idx].sum())
            rows = group.local_rows(mb_idx)  # this process's rows of the minibatch: all of them in one process
            parts = micro_batches(rollout, rows, cfg)
            optimizer.zero_grad(set_to_none=True)
            mb_stats: dict[str, float] = defaultdict(float)
            loss_total = 0.0
            for j, part_rows in enumerate(parts):
                part = trim_padding(rollout.minibatch(part_rows))
                with group.no_sync([policy, critic.wrapped], skip=j + 1 < len(parts)):
                    loss, stats = _micro_backward(policy, critic, part, cfg, train_policy,
                                                  float(part.policy_mask.sum()) / mb_tokens, backward, entropy,
                                                  precision)
                loss_total += loss
                for k, v in stats.items():
                    mb_stats[k] += v
            if use_ptx:
                with precision():
                    ptx, share = ptx_share(policy, ptx_batch(), group)
                backward(cfg.ptx_coef * ptx * share)
                loss_total += cfg.ptx_coef * float(ptx.detach()) * share
                mb_stats["ptx_loss"] = float(ptx.detach()) * share
            loss_total, mb_stats = summed(group, loss_total, mb_stats)
            norms, grad_norm = _clip_grad_norms(groups, params, cfg.max_grad_norm)
            # NaN/inf guard: a non-finite loss or gradient never reaches the weights or Adam's moments.
            if not (torch.isfinite(torch.tensor(loss_total)) and torch.isfinite(grad_norm)):
                optimizer.zero_grad(set_to_none=True)
                sums["refused_steps"] += 1.0
                continue
            optimizer.step()
            step_stats = {**mb_stats, **{f"grad_norm_{name}": v for name, v in norms.items()},
                          "grad_norm": float(grad_norm), "loss": loss_total}
            for k, v in step_stats.items():
                sums[k] += v
                counts[k] += 1
            n += 1
            # Early stop on the policy's drift from the rollout policy (SB3 / OpenAI spinning-up `target_kl`).
            if cfg.early_stop_kl is not None and mb_stats.get("approx_kl", 0.0) > cfg.early_stop_kl:
                stop = True
                break
        if stop:
            break
    policy.eval()
    critic.module.eval()
    refused = sums.pop("refused_steps", 0.0)
    out = {k: v / counts[k] for k, v in sums.items() if counts[k]} if n else {}
    out["refused_steps"] = refused
    out["epochs"] = float(epochs_run)
    return out


def _clip_grad_norms(
    groups: dict[str, list[torch.Tensor]], params: list[torch.Tensor], max_norm: float
) -> tuple[dict[str, float], torch.Tensor]:
    """Each group's gradient L2 norm and the global one (both before clipping), then clip all gradients to
    `max_norm` by the global norm. Every gradient's norm is computed once: the global norm is the root of the sum of
    the groups' squares. A group without gradients has norm 0."""
    per_group = {
        name: torch.nn.utils.get_total_norm([p.grad for p in ps if p.grad is not None]) for name, ps in groups.items()
    }
    # The norm of the group norms; get_total_norm also brings them to one device (an empty group's 0 is on the CPU).
    total = torch.nn.utils.get_total_norm(list(per_group.values()))
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return {name: float(v) for name, v in per_group.items()}, total
