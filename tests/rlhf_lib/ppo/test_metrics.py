from __future__ import annotations

import math

import pytest
import torch

from rlhf_lib.ppo.metrics import explained_variance

RETURNS = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)


def test_perfect_prediction_is_one() -> None:
    assert explained_variance(RETURNS.clone(), RETURNS, MASK) == pytest.approx(1.0)


def test_predicting_the_mean_is_zero() -> None:
    # mean of the real returns 1, 2, 3 is 2: residual = returns - 2, same variance -> EV = 0
    assert explained_variance(torch.full((1, 4), 2.0), RETURNS, MASK) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_hand_case_ignores_padding(dtype: torch.dtype) -> None:
    # real: R = [1, 2, 3], V = [1, 2, 2]; residual [0, 0, 1]
    # Var(res) = mean([1/9, 1/9, 4/9]) = 2/9 ; Var(R) = 2/3 ; EV = 1 - (2/9) / (2/3) = 2/3
    # the PAD position holds huge garbage that would change both variances
    values = torch.tensor([[1.0, 2.0, 2.0, -1e6]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 1e6]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=dtype)
    assert explained_variance(values, returns, mask) == pytest.approx(2 / 3, abs=1e-6)


def test_constant_returns_is_nan() -> None:
    assert math.isnan(explained_variance(torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3)))


def test_empty_mask_raises() -> None:
    with pytest.raises(ValueError):
        explained_variance(torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3))
