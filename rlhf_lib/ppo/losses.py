"""PPO losses for the policy and the value head, and the entropy of the policy.

Notation: B = batch, T = response length; `mask` (B, T) bool or float, 1 on real response tokens. Means are
token-level over every real token of the minibatch (masked_mean over (B, T)), as in the N+ implementation details
(Huang et al. 2024) and TRL, so long responses weigh by their token count.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf_lib.lm.masked import masked_mean


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_eps: float,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate objective of PPO (Schulman et al. 2017, eq. 7), as a loss to minimise.

    Shape: logprobs, old_logprobs, advantages, mask, is_weights (B, T) -> loss ().
    rho_t = exp(log pi(y_t) - log pi_old(y_t))
    L     = mean_t w_t max(-A_t rho_t, -A_t clip(rho_t, 1 - eps, 1 + eps))    (= -min(...) of the paper)
    w_t: the truncated importance weights of tokens sampled by an older policy (`truncated_is_weights`; constants,
    no gradient); 1 when `is_weights` is None (the rollout's own policy sampled them).
    Stats: policy_loss; clipfrac, the share of real tokens where the clipped branch is the max (strictly larger,
    so where it has no gradient); approx_kl = mean_t (log rho_t)^2 / 2, the k2 estimator of KL(pi_old || pi)
    (Schulman's "Approximating KL divergence"; the N+ implementation details log it, low variance and >= 0);
    ratio_mean.
    """
    m = mask.bool()
    # Padded log-ratios are set to 0 (rho = 1) before exp: a garbage PAD log-prob could overflow exp to inf, and
    # inf * 0 in the backward pass would put NaN in the gradient even though the forward masks it out.
    log_ratio = torch.where(m, logprobs - old_logprobs, torch.zeros((), dtype=logprobs.dtype, device=logprobs.device))
    ratio = torch.exp(log_ratio)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(pg_unclipped, pg_clipped)
    loss = masked_mean(per_token if is_weights is None else is_weights.detach() * per_token, m)
    with torch.no_grad():
        stats = {
            "policy_loss": loss.item(),
            "clipfrac": masked_mean((pg_clipped > pg_unclipped).float(), m).item(),
            "approx_kl": masked_mean(0.5 * log_ratio**2, m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
        }
    return loss, stats


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_range: float
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss (PPO2 baselines; N+ implementation details, Huang et al. 2024, "value function clipping").

    Shape: values, old_values, returns, mask (B, T) -> loss ().
    V_clip = V_old + clip(V - V_old, -c, c)
    L      = 0.5 * mean_t max((V_t - R_t)^2, (V_clip_t - R_t)^2)
    The max is pessimistic: the value head gets no gradient to move further than c from its rollout value
    when that move lowers the loss. Stats: value_loss; value_clipfrac, the share of real tokens where the
    clipped term is strictly larger.
    """
    m = mask.bool()
    v_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (v_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(loss_unclipped, loss_clipped), m)
    with torch.no_grad():
        stats = {
            "value_loss": loss.item(),
            "value_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), m).item(),
        }
    return loss, stats


def truncated_is_weights(
    old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance weights of tokens sampled by a stale policy mu for the update of pi_old (one-step-off
    rollouts, `ppo.async_rollouts`; Ionides 2008; Yao et al. 2025 "truncated importance sampling").

    Shape: old_logprobs, behaviour_logprobs, mask (B, T) -> weights (B, T), 0 on padding.
    w_t = min(exp(log pi_old(y_t) - log mu(y_t)), cap)
    Stats over real tokens: is_weight_mean and is_weight_max of the weights before truncation (the mean is about 1
    while mu and pi_old agree), is_truncated_frac: the share above `cap`.
    """
    m = mask.bool()
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)
    raw = torch.exp(torch.where(m, old_logprobs - behaviour_logprobs, zero)) * m
    weights = torch.clamp(raw, max=cap)
    real = raw[m]
    stats = {
        "is_weight_mean": masked_mean(raw, m).item(),
        "is_weight_max": float(real.max()) if real.numel() else 0.0,
        "is_truncated_frac": masked_mean((raw > cap).float(), m).item(),
    }
    return weights, stats
