from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lib.lm.entropy import entropy_from_logits
from rlhf_lib.ppo.losses import policy_loss, value_loss


def _policy_case(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    # eps = 0.2; 4 real tokens and 1 PAD whose log-prob is garbage (exp(1000) overflows to inf)
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5])
    logprobs = torch.cat([ratio.log(), torch.tensor([1000.0])])[None].requires_grad_(True)
    old_logprobs = torch.zeros(1, 5)
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=dtype)
    return logprobs, old_logprobs, advantages, mask


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_policy_clip_both_signs(dtype: torch.dtype) -> None:
    logprobs, old, adv, mask = _policy_case(dtype)
    loss, stats = policy_loss(logprobs, old, adv, mask, clip_eps=0.2)
    # tok0 A=+1 rho=1.5: max(-1.5, -1.2) = -1.2  clipped (rho > 1 + eps, A > 0)
    # tok1 A=-1 rho=0.5: max( 0.5,  0.8) =  0.8  clipped (rho < 1 - eps, A < 0)
    # tok2 A=+1 rho=0.5: max(-0.5, -0.8) = -0.5  unclipped
    # tok3 A=-1 rho=1.5: max( 1.5,  1.2) =  1.5  unclipped
    # loss = (-1.2 + 0.8 - 0.5 + 1.5) / 4 = 0.15 ; clipfrac = 2 / 4 ; ratio_mean = (1.5 + 0.5 + 0.5 + 1.5) / 4 = 1
    assert_close(loss, torch.tensor(0.15))
    assert stats["policy_loss"] == pytest.approx(0.15, abs=1e-6)
    assert stats["clipfrac"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    # approx_kl = 0.5 * mean(ln1.5^2, ln0.5^2, ln0.5^2, ln1.5^2) = 0.5 * (0.164402 + 0.480453) / 2 = 0.161214
    assert stats["approx_kl"] == pytest.approx(0.161214, abs=1e-6)
    loss.backward()
    # d loss / d logprob = -A * rho / 4 on unclipped tokens, 0 on clipped ones and on the PAD (no NaN from inf):
    # tok2: -1 * 0.5 / 4 = -0.125 ; tok3: 1 * 1.5 / 4 = 0.375
    assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, -0.125, 0.375, 0.0]]))


def test_policy_inside_trust_region_is_plain_pg() -> None:
    # rho = 1.1 in [0.8, 1.2], A = 2: loss = -2 * 1.1 = -2.2, no clipping
    loss, stats = policy_loss(torch.tensor([[math.log(1.1)]]), torch.zeros(1, 1), torch.tensor([[2.0]]),
                              torch.ones(1, 1), 0.2)
    assert_close(loss, torch.tensor(-2.2))
    assert stats["clipfrac"] == 0.0


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_value_clip_hand(dtype: torch.dtype) -> None:
    # clip 0.2
    # tok0 old 1.0, V 1.5, R 2.0: V_clip = 1.2 ; (1.5-2)^2 = 0.25, (1.2-2)^2 = 0.64 -> 0.64 (clipped larger)
    # tok1 old 1.0, V 1.1, R 0.0: V_clip = 1.1 ; both 1.21 -> 1.21 (tie: not counted as clipped)
    # tok2 old 0.0, V -0.5, R 0.0: V_clip = -0.2 ; 0.25 vs 0.04 -> 0.25
    # tok3 PAD (garbage)
    # loss = 0.5 * (0.64 + 1.21 + 0.25) / 3 = 0.35 ; value_clipfrac = 1 / 3
    values = torch.tensor([[1.5, 1.1, -0.5, 50.0]])
    old = torch.tensor([[1.0, 1.0, 0.0, -50.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0, math.nan]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=dtype)
    loss, stats = value_loss(values, old, returns, mask, clip_range=0.2)
    assert_close(loss, torch.tensor(0.35))
    assert stats["value_loss"] == pytest.approx(0.35, abs=1e-6)
    assert stats["value_clipfrac"] == pytest.approx(1 / 3)


def test_entropy_uniform_is_log_v() -> None:
    logits = torch.full((2, 3, 7), 3.0)
    assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(7)))


def test_entropy_peaked_is_zero_and_stable() -> None:
    # p ~ [1, e^-100, e^-100, e^-100]: H ~ 3 * 100 e^-100 ~ 0; 1000-scale logits must not overflow
    logits = torch.tensor([[100.0, 0.0, 0.0, 0.0], [1000.0, -1000.0, 0.0, 0.0]])
    assert_close(entropy_from_logits(logits), torch.zeros(2), atol=1e-6, rtol=0)


def test_entropy_two_classes_hand() -> None:
    # logits [0, ln 3] -> p = [1/4, 3/4]; H = 0.25 ln 4 + 0.75 ln(4/3) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([0.0, math.log(3.0)])
    assert_close(entropy_from_logits(logits), torch.tensor(0.562335), atol=1e-6, rtol=0)


def test_entropy_matches_categorical() -> None:
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0)) * 4
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert_close(entropy_from_logits(logits), expected)
