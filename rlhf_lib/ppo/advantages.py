"""Per-token rewards of a rollout, then advantages and returns by GAE.

Notation: B = batch, T = response length (right-padded); `mask` (B, T) bool or float, 1 on the policy's own tokens
(up to and including EOS). The episode of row b is its response; it ends at its last policy token e_b. In a
multi-turn rollout (docs/environments.md) the mask has holes: the environment's tokens between two policy turns are
0, and every function here skips them as if they were not there. All are pure functions of rollout data: they run
under `torch.no_grad()`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf_lib.lm.kl import KLEstimator, kl_per_token


def last_index(mask: Tensor) -> Tensor:
    """Index of each row's last policy token (holes of environment tokens allowed). Shape: (B, T) -> (B,) long.

    Raises:
        ValueError: if a row has no policy token: there is no token to put its score on.
    """
    m = mask.bool()
    if (empty := ~m.any(dim=1)).any():
        rows = torch.nonzero(empty).flatten().tolist()
        raise ValueError(f"rows {rows} have no real response token: there is no token to put their score on.")
    positions = torch.arange(1, m.shape[1] + 1, device=m.device)
    return (m * positions).argmax(dim=1)


@torch.no_grad()
def compute_rewards(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float,
    estimator: KLEstimator = "k1",
) -> tuple[Tensor, dict[str, float]]:
    """Per-token rewards: a KL penalty on every real token, plus the reward-model score on the last one.

    Shape: scores (B,); logprobs, ref_logprobs, mask (B, T) -> rewards (B, T).
    r_t = -beta * KL_t(pi || pi_ref)        on policy tokens (0 on padding and environment tokens)
    r_{e_b} += score_b                       (InstructGPT eq. 2, Ouyang et al. 2022: the RM scores the whole
                                             response, so its reward lands on the final token; the N+
                                             implementation details, Huang et al. 2024, put it on the EOS /
                                             last real token, never on a PAD position)
    KL_t is `kl_per_token(..., estimator)`; k1 is the estimator of InstructGPT and Ziegler et al. 2019.

    Stats: non_score_reward (mean over rows of sum_t -beta KL_t), score_mean, reward_total (mean over rows of
    sum_t r_t).

    Raises:
        ValueError: if a row has no policy token.
    """
    m = mask.bool()
    last = last_index(m)
    kl = kl_per_token(logprobs, ref_logprobs, estimator)
    non_score = torch.where(m, -kl_coef * kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    rewards = non_score.clone()
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last] += scores.to(rewards.dtype)
    stats = {
        "non_score_reward": non_score.sum(dim=1).mean().item(),
        "score_mean": scores.float().mean().item(),
        "reward_total": rewards.sum(dim=1).mean().item(),
    }
    return rewards, stats


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), per row, ending each episode at its last real token.

    Shape: rewards, values, mask (B, T) -> advantages (B, T), returns (B, T); both 0 on padded positions.
    delta_t = r_t + gamma * V_{t+1} * m_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1} * m_{t+1}
    R_t     = A_t + V_t                               (the value target, a TD(lambda) return)
    where t+1 is the next POLICY token: an environment token (mask 0 between two policy turns) is skipped, its
    value and reward never read, so GAE runs over the policy's tokens only, as if the observation were part of
    the state (verl's multi-turn GAE does the same). After the last policy token there is none (V = A = 0): the
    response is the whole episode, so nothing is bootstrapped past EOS and a PAD position's value or reward never
    leaks in. Vectorised over B, loop over T. No gradient flows (torch.no_grad): advantages and returns are
    targets; both are 0 on every masked position.
    """
    m = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    # torch.where, not a product with the mask: a NaN value on a PAD position must not turn the sum into NaN.
    values_real = torch.where(m, values, zero)
    rewards_real = torch.where(m, rewards.to(values.dtype), zero)
    advantages = torch.zeros_like(values_real)
    next_adv = torch.zeros_like(values_real[:, 0])
    next_value = torch.zeros_like(values_real[:, 0])
    for t in reversed(range(values_real.shape[1])):
        delta = rewards_real[:, t] + gamma * next_value - values_real[:, t]
        here = m[:, t]
        advantages[:, t] = torch.where(here, delta + gamma * lam * next_adv, zero)
        # A masked position passes the next policy token's advantage and value through unchanged.
        next_adv = torch.where(here, advantages[:, t], next_adv)
        next_value = torch.where(here, values_real[:, t], next_value)
    returns = torch.where(m, advantages + values_real, zero)
    return advantages, returns


@torch.no_grad()
def group_advantages(rewards: Tensor, mask: Tensor, group_size: int, estimator: str) -> Tensor:
    """Critic-free advantages from k samples per prompt: each row's whole-response return against its group.

    Shape: rewards, mask (B, T) with B = G * k rows ordered group by group (rows g*k .. g*k+k-1 answer the same
    prompt) -> advantages (B, T): the row's advantage on each real token, 0 on padding.
    R_i = sum_t r_t                          the KL-shaped return of the whole response (gamma = 1)
    grpo:  A_i = (R_i - mean_g R) / (std_g R + 1e-8)      (Shao et al. 2024, DeepSeekMath, eq. 3;
                                                           std unbiased, as their reference code)
    rloo:  A_i = R_i - 1/(k-1) sum_{j != i} R_j          (Ahmadian et al. 2024, "Back to Basics": REINFORCE
                                                           with a leave-one-out baseline; = k/(k-1) (R_i - mean_g R))
    Here the KL penalty stays in the per-token reward for every estimator (as RLOO and TRL's RLOOTrainer do),
    so one reward definition serves all three; GRPO's KL-in-the-loss variant is not implemented.
    """
    m = mask.bool()
    b = rewards.shape[0]
    if group_size < 2 or b % group_size:
        raise ValueError(f"batch of {b} rows is not a whole number of groups of {group_size} (need >= 2 per group)")
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    returns = torch.where(m, rewards, zero).sum(1).view(-1, group_size)  # (G, k)
    mean = returns.mean(1, keepdim=True)
    if estimator == "grpo":
        adv = (returns - mean) / (returns.std(1, keepdim=True) + 1e-8)
    elif estimator == "rloo":
        adv = (returns - mean) * group_size / (group_size - 1)
    else:
        raise ValueError(f"unknown group advantage estimator {estimator!r}; expected 'grpo' or 'rloo'")
    return torch.where(m, adv.reshape(b, 1).expand_as(rewards), zero)
