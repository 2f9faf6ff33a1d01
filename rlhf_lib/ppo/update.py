"""5. update: N epochs x M minibatches of clipped-surrogate + clipped-value + entropy steps over one rollout."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.ppo.losses import policy_loss, value_loss
from rlhf_lib.ppo.masked import masked_mean
from rlhf_lib.ppo.scoring import response_logprobs, token_values
from rlhf_lib.ppo.types import Rollout

if TYPE_CHECKING:  # transformers' model classes cost ~2 s to import; a cached run never needs them
    from transformers import PreTrainedModel


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


def ppo_epochs(
    policy: PreTrainedModel,
    value_model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    cfg: PPOConfig,
    generator: torch.Generator,
) -> dict[str, float]:
    """Run `cfg.epochs` passes of `cfg.minibatches` minibatches over `rollout`; return the mean of each stat
    over the steps taken, and `refused_steps`: minibatches whose loss or gradient was not finite (skipped).

    Loss per minibatch (PPO eq. 9, signs as minimised):
        L = L_clip(policy) + vf_coef * L_value_clipped - ent_coef * H(policy)
    The value model is separate, so the value term only moves its weights; one Adam holds both (as TRL does).
    """
    rollout.require("advantages", "returns", "values")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    b_size = rollout.batch_size
    mb_size = b_size // cfg.minibatches
    sums: dict[str, float] = defaultdict(float)
    n = 0
    policy.train()
    value_model.train()
    for _epoch in range(cfg.epochs):
        b_perm = torch.randperm(b_size, generator=generator)
        for start in range(0, b_size, mb_size):
            mb = trim_padding(rollout.minibatch(b_perm[start : start + mb_size]))
            mb_mask = mb.response_mask
            new_logprobs, entropy = response_logprobs(
                policy, mb.query, mb.query_mask, mb.response, mb_mask, cfg.temperature, with_entropy=True
            )
            if cfg.ent_coef == 0:  # logged only: keep its (B, R, V) softmax out of the backward pass
                entropy = entropy.detach()
            new_values = token_values(value_model, mb.query, mb.query_mask, mb.response, mb_mask)
            pg_loss, pg_stats = policy_loss(new_logprobs, mb.logprobs, mb.advantages, mb_mask, cfg.clip_eps)
            vf_loss, vf_stats = value_loss(new_values, mb.values, mb.returns, mb_mask, cfg.value_clip)
            mb_entropy = masked_mean(entropy, mb_mask)
            loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * mb_entropy

            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            # NaN/inf guard: a non-finite loss or gradient never reaches the weights or Adam's moments.
            if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
                optimizer.zero_grad(set_to_none=True)
                sums["refused_steps"] += 1.0
                continue
            optimizer.step()

            for k, v in {**pg_stats, **vf_stats}.items():
                sums[k] += float(v)
            sums["entropy"] += float(mb_entropy.detach())
            sums["grad_norm"] += float(grad_norm)
            sums["loss"] += float(loss.detach())
            n += 1
    policy.eval()
    value_model.eval()
    refused = sums.pop("refused_steps", 0.0)
    out = {k: v / n for k, v in sums.items()} if n else {}
    out["refused_steps"] = refused
    return out
