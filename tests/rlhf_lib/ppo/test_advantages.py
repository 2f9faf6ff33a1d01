from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rlhf_lib.ppo.advantages import compute_rewards, gae, group_advantages

NAN = math.nan


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_compute_rewards_k1_hand(dtype: torch.dtype) -> None:
    # r = logprobs - ref: row 0 [0.1, -0.2, 0.3]; row 1 [0.5, <pad>, <pad>] (pads hold garbage)
    logprobs = torch.tensor([[0.1, -0.2, 0.3], [0.5, 100.0, NAN]])
    ref_logprobs = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=dtype)
    scores = torch.tensor([2.0, -1.0])
    rewards, stats = compute_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
    # KL part -0.1 * r: row 0 [-0.01, 0.02, -0.03]; row 1 [-0.05, 0, 0]
    # + score on the last real token: row 0 index 3 - 1 = 2 -> -0.03 + 2 = 1.97; row 1 index 0 -> -0.05 - 1 = -1.05
    assert_close(rewards, torch.tensor([[-0.01, 0.02, 1.97], [-1.05, 0.0, 0.0]]))
    # non_score: row sums [-0.02, -0.05] -> -0.035; score_mean (2 - 1) / 2 = 0.5; total [1.98, -1.05] -> 0.465
    assert stats["non_score_reward"] == pytest.approx(-0.035, abs=1e-6)
    assert stats["score_mean"] == pytest.approx(0.5, abs=1e-6)
    assert stats["reward_total"] == pytest.approx(0.465, abs=1e-6)


def test_compute_rewards_forwards_estimator() -> None:
    logprobs, ref_logprobs = torch.tensor([[0.1, -0.2]]), torch.zeros(1, 2)
    rewards, _ = compute_rewards(torch.tensor([1.0]), logprobs, ref_logprobs, torch.ones(1, 2), 0.1, "k2")
    # k2 = 0.5 r^2 = [0.005, 0.02]; * -0.1 = [-0.0005, -0.002]; + 1 at index 1 -> 0.998
    assert_close(rewards, torch.tensor([[-0.0005, 0.998]]))


def test_score_on_last_real_token_of_each_length() -> None:
    # lengths 4, 1, 2, 3 ; logprobs == ref, so the KL part is 0 and only the scores show
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    lp = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    rewards, _ = compute_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0]), lp, lp.clone(), mask, kl_coef=0.5)
    expected = torch.tensor([[0, 0, 0, 1.0], [2.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 4.0, 0]])
    assert_close(rewards, expected)
    assert (rewards[~mask] == 0).all()


def test_compute_rewards_rejects_empty_row() -> None:
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="no real response token"):
        compute_rewards(torch.zeros(2), lp, lp, torch.tensor([[1, 1, 0], [0, 0, 0]]), 0.1)


def test_compute_rewards_skips_holes() -> None:
    # Row 0 [policy, env, policy]: KL only on the policy tokens, the score on index 2 (the last policy token), the
    # environment token's garbage log-probs (50 vs -50) never read. Row 1 [policy, env, pad]: the score on index 0.
    lp = torch.tensor([[0.2, 50.0, 0.4], [0.3, 50.0, 0.0]])
    ref = torch.tensor([[0.0, -50.0, 0.0], [0.0, -50.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    rewards, _ = compute_rewards(torch.tensor([1.0, 2.0]), lp, ref, mask, 0.5)
    # -0.5 * [0.2, -, 0.4] = [-0.1, 0, -0.2] + 1 at 2; row 1: -0.5 * 0.3 = -0.15 + 2 at 0
    assert_close(rewards, torch.tensor([[-0.1, 0.0, 0.8], [1.85, 0.0, 0.0]]))


def test_gae_1x3_hand() -> None:
    # gamma = 1, lam = 0.5 ; r = [0, 0, 1], V = [0.5, 1.0, 1.5], episode ends at t = 2 (V_3 = A_3 = 0)
    # t=2: delta = 1 + 1 * 0   - 1.5 = -0.5 ; A_2 = -0.5
    # t=1: delta = 0 + 1 * 1.5 - 1.0 =  0.5 ; A_1 = 0.5 + 1 * 0.5 * (-0.5) = 0.25
    # t=0: delta = 0 + 1 * 1.0 - 0.5 =  0.5 ; A_0 = 0.5 + 1 * 0.5 * 0.25   = 0.625
    # returns = A + V = [1.125, 1.25, 1.0]
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 1.0, 1.5]]), torch.ones(1, 3), 1.0, 0.5)
    assert_close(adv, torch.tensor([[0.625, 0.25, -0.5]]))
    assert_close(ret, torch.tensor([[1.125, 1.25, 1.0]]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_gae_with_padding_hand(dtype: torch.dtype) -> None:
    # row 0: the 1x3 case above plus one PAD holding garbage (reward 7, value 9): it must not be bootstrapped.
    # row 1: length 2, r = [0.5, 1.0], V = [1.0, 2.0], pads NaN:
    #   t=1: delta = 1.0 + 0 - 2.0 = -1.0 ; A_1 = -1.0
    #   t=0: delta = 0.5 + 2.0 - 1.0 = 1.5 ; A_0 = 1.5 + 0.5 * (-1.0) = 1.0 ; returns [2.0, 1.0]
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0], [0.5, 1.0, NAN, NAN]])
    values = torch.tensor([[0.5, 1.0, 1.5, 9.0], [1.0, 2.0, NAN, NAN]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=dtype)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert_close(adv, torch.tensor([[0.625, 0.25, -0.5, 0.0], [1.0, -1.0, 0.0, 0.0]]))
    assert_close(ret, torch.tensor([[1.125, 1.25, 1.0, 0.0], [2.0, 1.0, 0.0, 0.0]]))


def test_gae_discounted_hand() -> None:
    # gamma = 0.9, lam = 0.8 ; r = [0, 1], V = [0.5, 0.4]
    # t=1: delta = 1 - 0.4 = 0.6 ; A_1 = 0.6
    # t=0: delta = 0 + 0.9 * 0.4 - 0.5 = -0.14 ; A_0 = -0.14 + 0.72 * 0.6 = 0.292 ; returns [0.792, 1.0]
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.4]]), torch.ones(1, 2), 0.9, 0.8)
    assert_close(adv, torch.tensor([[0.292, 0.6]]))
    assert_close(ret, torch.tensor([[0.792, 1.0]]))


def _reference_gae(
    rewards: list[list[float]], values: list[list[float]], lengths: list[int], gamma: float, lam: float
) -> list[list[float]]:
    out = []
    for r, v, n in zip(rewards, values, lengths):
        adv = [0.0] * len(r)
        next_adv, next_value = 0.0, 0.0
        for t in reversed(range(n)):
            delta = r[t] + gamma * next_value - v[t]
            next_adv = delta + gamma * lam * next_adv
            adv[t] = next_adv
            next_value = v[t]
        out.append(adv)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.95), (0.9, 0.0), (1.0, 1.0)])
def test_gae_matches_python_double_loop(seed: int, gamma: float, lam: float) -> None:
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 11
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    expected = torch.tensor(
        _reference_gae(rewards.tolist(), values.tolist(), lengths.tolist(), gamma, lam), dtype=torch.float64
    )
    # Garbage (NaN) on padding must not reach any real token.
    rewards[~mask], values[~mask] = NAN, NAN
    adv, ret = gae(rewards, values, mask, gamma, lam)
    assert_close(adv, expected)
    assert_close(ret, torch.where(mask, expected + values.nan_to_num(), 0.0))


def test_gae_no_grad() -> None:
    values = torch.randn(2, 3, requires_grad=True)
    adv, ret = gae(torch.randn(2, 3), values, torch.ones(2, 3), 1.0, 0.95)
    assert not adv.requires_grad and not ret.requires_grad


# Critic-free estimators -------------------------------------------------------------------------------------


def test_rloo_is_the_leave_one_out_baseline():
    # Two groups of 3; returns are the row sums over real tokens: [1, 2, 6] and [0, 0, 3].
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 4.0], [0.0, 0.0], [0.0, 9.0], [3.0, 0.0]])
    mask = torch.tensor([[1, 0], [1, 1], [1, 1], [1, 1], [1, 0], [1, 0]])
    adv = group_advantages(rewards, mask, 3, "rloo")
    # Row 0: 1 - (2 + 6)/2 = -3; row 1: 2 - 3.5 = -1.5; row 2: 6 - 1.5 = 4.5; group 2 returns [0, 0, 3]
    # (the 9 is padding): -1.5, -1.5, 3.
    expected = [-3.0, -1.5, 4.5, -1.5, -1.5, 3.0]
    assert adv[:, 0].tolist() == pytest.approx(expected)
    assert adv[1, 1].item() == pytest.approx(-1.5) and adv[0, 1].item() == 0.0  # padding stays 0


def test_grpo_normalises_by_the_group():
    rewards = torch.tensor([[1.0], [2.0], [3.0], [5.0], [5.0], [5.0]])
    mask = torch.ones(6, 1)
    adv = group_advantages(rewards, mask, 3, "grpo")
    # Group 1: mean 2, unbiased std 1 -> -1, 0, 1; group 2: all equal -> 0 (no NaN).
    assert adv[:, 0].tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0], abs=1e-6)


def test_group_advantages_refuse_a_ragged_batch():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6, 2), torch.ones(6, 2), 4, "grpo")
