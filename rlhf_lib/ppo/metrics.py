"""Diagnostics of a PPO update. Notation: B = batch, T = response length; `mask` (B, T), 1 on real tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf_lib.ppo.masked import masked_mean, masked_var


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """How much of the returns' variance the value head explains, over real tokens. Shape: (B, T) x3 -> float.

    EV = 1 - Var(R - V) / Var(R): 1 for a perfect value head, 0 for one predicting the mean return, < 0 for
    worse than that (the diagnostic of OpenAI baselines' PPO2). NaN when Var(R) = 0 (undefined).
    Biased variances: the n / (n - 1) factors cancel in the ratio, and one real token then gives NaN, not an error.

    Raises:
        ValueError: if the mask selects no element.
    """
    var_returns = masked_var(returns, mask, unbiased=False).item()
    if var_returns == 0.0:
        return float("nan")
    return 1.0 - masked_var(returns - values, mask, unbiased=False).item() / var_returns


# ppo_epochs' stat -> dashboard metric name.
UPDATE_METRICS = {
    "policy_loss": "loss/policy", "value_loss": "loss/value", "ptx_loss": "loss/ptx", "loss": "loss/total",
    "entropy": "policy/entropy", "clipfrac": "policy/clipfrac", "approx_kl": "policy/approx_kl",
    "ratio_mean": "policy/ratio_mean", "value_clipfrac": "value/clipfrac", "grad_norm": "grad_norm/total",
    "grad_norm_policy": "grad_norm/policy", "grad_norm_value": "grad_norm/value",
    "refused_steps": "update/refused_steps", "epochs": "update/epochs",
}


def spread(name: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std, min and max of `x` over real tokens, as `name/mean` ... Shape: x, mask (B, T)."""
    m = mask.bool()
    real = x[m]
    return {f"{name}/mean": float(masked_mean(x, m)), f"{name}/std": float(masked_var(x, m, unbiased=False).sqrt()),
            f"{name}/min": float(real.min()), f"{name}/max": float(real.max())}
