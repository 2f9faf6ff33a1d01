from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lib.lm.kl import kl_per_token, kl_stats
from rlhf_lib.ppo.kl import AdaptiveKLController, FixedKLController

LN2 = math.log(2.0)  # 0.693147


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    # pi = [0.5, 0.25], pi_ref = [0.25, 0.5] on the sampled tokens -> r = log(pi / pi_ref) = [ln 2, -ln 2]
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.5)]])
    return logprobs, ref_logprobs


def test_k1() -> None:
    assert_close(kl_per_token(*_pair(), "k1"), torch.tensor([[LN2, -LN2]]))


def test_k2() -> None:
    # 0.5 * (+-0.693147)^2 = 0.240227 for both signs
    assert_close(kl_per_token(*_pair(), "k2"), torch.tensor([[0.240227, 0.240227]]), atol=1e-6, rtol=0)


def test_k3() -> None:
    # r = ln 2:  e^{-r} - 1 + r = 0.5 - 1 + 0.693147 = 0.193147
    # r = -ln 2: e^{-r} - 1 + r = 2 - 1 - 0.693147 = 0.306853
    assert_close(kl_per_token(*_pair(), "k3"), torch.tensor([[0.193147, 0.306853]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_zero_when_equal(est: str) -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.1]])
    assert_close(kl_per_token(lp, lp.clone(), est), torch.zeros(1, 3))


def test_k2_k3_nonnegative_k1_not() -> None:
    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(64, 32, generator=g) * 5, -torch.rand(64, 32, generator=g) * 5
    assert (kl_per_token(lp, ref, "k2") >= 0).all()
    assert (kl_per_token(lp, ref, "k3") >= 0).all()
    assert (kl_per_token(lp, ref, "k1") < 0).any()


def test_unbiasedness_monte_carlo() -> None:
    # pi = [0.7, 0.2, 0.1], pi_ref = [0.4, 0.4, 0.2]; KL = 0.7 ln(7/4) + 0.2 ln(1/2) + 0.1 ln(1/2)
    #                                            = 0.391736 - 0.138629 - 0.069315 = 0.183792
    pi, ref = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.4, 0.4, 0.2])
    true_kl = 0.7 * math.log(7 / 4) + 0.3 * math.log(0.5)
    y = torch.multinomial(pi, 400_000, replacement=True, generator=torch.Generator().manual_seed(0))
    lp, lr = pi.log()[y][None], ref.log()[y][None]
    assert abs(kl_per_token(lp, lr, "k1").mean().item() - true_kl) < 5e-3
    assert abs(kl_per_token(lp, lr, "k3").mean().item() - true_kl) < 5e-3
    # k3 has lower variance than k1 here, as claimed.
    assert kl_per_token(lp, lr, "k3").var() < kl_per_token(lp, lr, "k1").var()


def test_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="k4"):
        kl_per_token(*_pair(), "k4")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_kl_stats_sum_over_tokens_mean_over_batch(dtype: torch.dtype) -> None:
    # row 0: r = [ln 2, -ln 2]; row 1: r = [ln 2, <pad: 100>]
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.5), 100.0]])
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.5)], [math.log(0.25), 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=dtype)
    stats = kl_stats(logprobs, ref_logprobs, mask)
    # k1: row sums [0, ln 2] -> mean 0.346574
    # k2: row sums [0.480453, 0.240227] -> mean 0.360340
    # k3: row sums [0.193147 + 0.306853 = 0.5, 0.193147] -> mean 0.346574
    assert set(stats) == {"kl_k1", "kl_k2", "kl_k3"}
    assert stats["kl_k1"] == pytest.approx(0.346574, abs=1e-6)
    assert stats["kl_k2"] == pytest.approx(0.360340, abs=1e-6)
    assert stats["kl_k3"] == pytest.approx(0.346574, abs=1e-6)


def test_adaptive_high_side_clipped() -> None:
    ctl = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    # error = 12 / 6 - 1 = 1 -> clipped to 0.2; mult = 1 + 0.2 * 64 / 10000 = 1.00128; 0.1 * 1.00128 = 0.100128
    ctl.update(current_kl=12.0, n_steps=64)
    assert ctl.value == pytest.approx(0.100128, rel=1e-12)


def test_adaptive_low_side_clipped() -> None:
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    # error = 0 / 6 - 1 = -1 -> clipped to -0.2; mult = 1 - 0.2 * 64 / 10000 = 0.99872; value 0.099872
    ctl.update(0.0, 64)
    assert ctl.value == pytest.approx(0.099872, rel=1e-12)


def test_adaptive_inside_clip() -> None:
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    # error = 6.6 / 6 - 1 = 0.1 (not clipped); mult = 1 + 0.1 * 64 / 10000 = 1.00064; value 0.100064
    ctl.update(6.6, 64)
    assert ctl.value == pytest.approx(0.100064, rel=1e-9)


def test_adaptive_state_dict_roundtrip() -> None:
    ctl = AdaptiveKLController(0.1, 6.0, 10000)
    ctl.update(12.0, 64)
    other = AdaptiveKLController(1.0, 1.0, 1)
    other.load_state_dict(ctl.state_dict())
    assert other.state_dict() == {"value": ctl.value, "target": 6.0, "horizon": 10000}
    ctl.update(3.0, 128)
    other.update(3.0, 128)
    assert other.value == ctl.value


def test_adaptive_rejects_bad_config() -> None:
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, 6.0, 0)


def test_fixed_controller() -> None:
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 64)
    assert ctl.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05
