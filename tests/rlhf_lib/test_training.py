"""The supervised stages' optimizer and schedule (rlhf_lib.training)."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.training import adamw_with_linear_schedule


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def test_cpu_adamw_is_fused_and_steps_like_the_reference_loop():
    fused, ref = _params(0), _params(0)
    opt, sched = adamw_with_linear_schedule(fused, lr=1e-2, weight_decay=0.1, total_steps=10)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, eps=1e-8, foreach=False)
    assert opt.defaults["fused"] is True
    for step in range(3):
        for p, q in zip(fused, ref):
            grad = torch.full_like(p, 0.5 * (step + 1))
            p.grad, q.grad = grad.clone(), grad.clone()
        for group in ref_opt.param_groups:  # the same warm-up factor as the schedule gives the fused side
            group["lr"] = opt.param_groups[0]["lr"]
        opt.step()
        ref_opt.step()
        sched.step()
    for p, q in zip(fused, ref):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_linear_warmup_then_decay_to_zero():
    opt, sched = adamw_with_linear_schedule(_params(0), lr=1.0, weight_decay=0.0, total_steps=20, warmup_frac=0.1)
    lrs = []
    for _ in range(20):
        lrs.append(sched.get_last_lr()[0])
        opt.step()  # no gradients: nothing moves, only the schedule's order of calls is kept
        sched.step()
    assert lrs[:3] == pytest.approx([0.5, 1.0, 1.0])  # 2 warm-up steps, then (20 - step) / 18
    assert lrs[2:] == pytest.approx([(20 - s) / 18 for s in range(2, 20)])
    assert sched.get_last_lr()[0] == 0.0
