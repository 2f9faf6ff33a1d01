"""Gradient norms of the update: per group and global, before clipping, and the clip by the global norm."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lib.ppo.update import _clip_grad_norms


def _param(*grad: float) -> torch.Tensor:
    p = torch.zeros(len(grad), requires_grad=True)
    p.grad = torch.tensor(grad)
    return p


def test_group_norms_global_norm_and_clip_by_hand() -> None:
    a1, a2, b, frozen = _param(3.0), _param(4.0), _param(0.0, 12.0), torch.zeros(2, requires_grad=True)
    groups = {"policy": [a1, a2], "value": [b], "head": [frozen]}  # frozen: no gradient
    norms, total = _clip_grad_norms(groups, [a1, a2, b, frozen], max_norm=6.5)
    assert norms == pytest.approx({"policy": 5.0, "value": 12.0, "head": 0.0})
    assert float(total) == pytest.approx(13.0)  # sqrt(5^2 + 12^2), before clipping
    coef = 6.5 / (13.0 + 1e-6)  # torch's clip coefficient: max_norm / (norm + eps)
    assert a1.grad.tolist() == pytest.approx([3.0 * coef])
    assert b.grad.tolist() == pytest.approx([0.0, 12.0 * coef])
    assert frozen.grad is None


def test_no_clip_below_the_bound_and_nonfinite_is_reported() -> None:
    p = _param(0.3, 0.4)
    norms, total = _clip_grad_norms({"policy": [p]}, [p], max_norm=1.0)
    assert norms["policy"] == pytest.approx(0.5) and p.grad.tolist() == pytest.approx([0.3, 0.4])
    q = _param(float("nan"), 1.0)
    _, total = _clip_grad_norms({"policy": [q]}, [q], max_norm=1.0)
    assert math.isnan(float(total))  # the caller's NaN guard refuses the step on it
