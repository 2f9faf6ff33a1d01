"""Masked reductions over right-padded response tensors.

Notation: B = batch, T = response length. `mask` is bool or float, Shape: (B, T) (or the shape of `x`), 1 on
real response tokens (up to and including EOS) and 0 on padding. Every statistic here ignores padded positions,
whatever they hold: padding is selected out with `torch.where`, not multiplied by 0, so a NaN/inf on a padded
position (e.g. a log-prob of a PAD token) cannot leak into a sum (NaN * 0 = NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _as_bool(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_i x_i * m_i over `dim` (all dims when None).

    Shape: x (B, T), mask broadcastable to x; out () when dim is None, else x's shape without `dim`.
    """
    kept = torch.where(_as_bool(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_i x_i m_i / sum_i m_i over `dim` (all dims when None).

    Shape: as `masked_sum`. An empty selection gives NaN (0 / 0), on purpose: a silent 0 would hide a bug.
    """
    m = _as_bool(mask)
    count = m.to(x.dtype).expand_as(x).sum() if dim is None else m.to(x.dtype).expand_as(x).sum(dim)
    return masked_sum(x, m, dim) / count


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries of `x`, over all dims. Shape: x (B, T) -> ().

    var = sum_i m_i (x_i - mu)^2 / n, times n / (n - 1) when `unbiased` (Bessel's correction, as TRL's
    `masked_var`), with n = sum_i m_i and mu = masked_mean(x, mask).

    Raises:
        ValueError: if the mask selects no element, or exactly one and `unbiased` (n - 1 = 0).
    """
    m = _as_bool(mask)
    n = int(m.expand_as(x).sum().item())
    if n == 0:
        raise ValueError("masked_var: the mask selects no element; the variance is undefined.")
    if unbiased and n == 1:
        raise ValueError("masked_var: unbiased variance needs at least 2 masked elements (n - 1 = 0); got 1.")
    mean = masked_mean(x, m)
    var = masked_mean((x - mean) ** 2, m)
    return var * (n / (n - 1)) if unbiased else var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten the masked entries of `x` with their own mean and (unbiased) variance. Shape: (B, T) -> (B, T).

    out = (x - mu) * rsqrt(var + eps)            when shift_mean
    out = (x - mu) * rsqrt(var + eps) + mu       otherwise (TRL semantics: rescale only; used to whiten rewards
                                                 without moving their mean, N+ implementation details,
                                                 Huang et al. 2024)
    Padded positions of the output are 0, so downstream sums over the whole tensor stay correct.
    """
    m = _as_bool(mask)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(m, whitened, torch.zeros((), dtype=whitened.dtype, device=whitened.device))
