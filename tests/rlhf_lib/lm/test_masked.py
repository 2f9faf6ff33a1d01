from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lib.lm.masked import masked_mean, masked_sum, masked_var, masked_whiten

NAN = math.nan


def _masks(rows: list[list[int]]) -> list[torch.Tensor]:
    return [torch.tensor(rows, dtype=torch.bool), torch.tensor(rows, dtype=torch.float32)]


@pytest.mark.parametrize("mask", _masks([[1, 1, 1], [1, 1, 0]]))
def test_sum_and_mean_ignore_padding_even_nan(mask: torch.Tensor) -> None:
    # Padded entry is NaN: a product with the mask would give NaN * 0 = NaN.
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, NAN]])
    # all: 1 + 2 + 3 + 4 + 5 = 15 over 5 real tokens -> mean 3
    assert_close(masked_sum(x, mask), torch.tensor(15.0))
    assert_close(masked_mean(x, mask), torch.tensor(3.0))
    # per row: [1 + 2 + 3, 4 + 5] = [6, 9]; means [6 / 3, 9 / 2] = [2, 4.5]
    assert_close(masked_sum(x, mask, dim=1), torch.tensor([6.0, 9.0]))
    assert_close(masked_mean(x, mask, dim=1), torch.tensor([2.0, 4.5]))


@pytest.mark.parametrize("mask", _masks([[1, 1, 1], [1, 1, 0]]))
def test_var_biased_and_unbiased(mask: torch.Tensor) -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 1000.0]])
    # real 1..5, mean 3, squared deviations 4 + 1 + 0 + 1 + 4 = 10; biased 10 / 5 = 2, unbiased 10 / 4 = 2.5
    assert_close(masked_var(x, mask, unbiased=False), torch.tensor(2.0))
    assert_close(masked_var(x, mask), torch.tensor(2.5))


def test_var_errors() -> None:
    x = torch.tensor([[1.0, 2.0]])
    with pytest.raises(ValueError, match="no element"):
        masked_var(x, torch.zeros(1, 2))
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(x, torch.tensor([[True, False]]))
    # one element, biased: (1 - 1)^2 / 1 = 0
    assert_close(masked_var(x, torch.tensor([[True, False]]), unbiased=False), torch.tensor(0.0))


@pytest.mark.parametrize("mask", _masks([[1, 1, 0], [1, 0, 0]]))
def test_whiten_ignores_padding_and_zeroes_it(mask: torch.Tensor) -> None:
    x = torch.tensor([[2.0, 4.0, 99.0], [6.0, NAN, -7.0]])
    # real 2, 4, 6: mean 4, deviations -2, 0, 2, unbiased var (4 + 0 + 4) / 2 = 4, std 2
    # shift_mean: (x - 4) / 2 = -1, 0, 1 ; padding -> 0
    assert_close(masked_whiten(x, mask), torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    # shift_mean=False adds the mean 4 back: 3, 4, 5 (same mean 4, std 1)
    out = masked_whiten(x, mask, shift_mean=False)
    assert_close(out, torch.tensor([[3.0, 4.0, 0.0], [5.0, 0.0, 0.0]]))
    assert_close(masked_mean(out, mask), torch.tensor(4.0))


def test_whiten_random_has_zero_mean_unit_var_on_real_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=g) * 3 + 5
    mask = torch.arange(9)[None, :] < torch.tensor([9, 3, 6, 1])[:, None]
    out = masked_whiten(x, mask)
    assert_close(masked_mean(out, mask), torch.tensor(0.0), atol=1e-6, rtol=0)
    assert_close(masked_var(out, mask), torch.tensor(1.0), atol=1e-5, rtol=0)
    assert (out[~mask] == 0).all()
