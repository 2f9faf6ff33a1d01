"""Diagnostics of a PPO update. Notation: B = batch, T = response length; `mask` (B, T), 1 on real tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf_lib.ppo.masked import masked_var


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
