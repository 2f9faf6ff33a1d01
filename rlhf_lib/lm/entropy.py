"""Entropy of a categorical distribution given by logits (PPO's bonus, the dashboard's entropy)."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim. Shape: (..., V) -> (...).

    H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v,  p = softmax(z).
    logsumexp and softmax subtract the max internally, so large logits do not overflow. One (..., V) copy (p) is
    made; the contraction p . z goes through einsum (a batched matmul), not a second (..., V) product.
    Logits must be finite: a -inf logit gives 0 * -inf = NaN.
    """
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.einsum("...v,...v->...", p, logits)
