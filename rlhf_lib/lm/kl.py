"""KL between a policy pi and a frozen reference pi_ref, estimated from samples of pi (PPO's penalty, eval's KL).

Notation: B = batch, T = response length; tokens y_t are sampled from pi, so per token the log-ratio
r_t = log pi(y_t) - log pi_ref(y_t) is a Monte-Carlo sample whose mean is KL(pi || pi_ref).
Estimators follow Schulman, "Approximating KL divergence" (2020 blog post), with ratio rho = pi_ref / pi = e^{-r}.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rlhf_lib.lm.masked import masked_sum

KLEstimator = Literal["k1", "k2", "k3"]


def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi. Shape: (B, T), (B, T) -> (B, T).

    r = logprobs - ref_logprobs = log(pi / pi_ref)
    k1 = r                      unbiased (E_pi[r] = KL); high variance, negative on some samples
                                (the estimator of InstructGPT and Ziegler et al. 2019 rewards).
    k2 = r^2 / 2                biased (its mean is an f-divergence equal to KL up to second order in
                                pi_ref / pi - 1); low variance, always >= 0.
    k3 = (rho - 1) - log(rho)   with rho = pi_ref / pi = e^{-r}: unbiased (E_pi[rho - 1] = 0, so the
                                control variate adds nothing in mean), lower variance than k1, always >= 0
                                (log x <= x - 1).
    Padded positions hold whatever the inputs hold: callers mask.
    """
    r = logprobs - ref_logprobs
    if estimator == "k1":
        return r
    if estimator == "k2":
        return 0.5 * r**2
    if estimator == "k3":
        # expm1 keeps e^{-r} - 1 accurate for the small |r| that dominate a well-regularised run.
        return torch.expm1(-r) + r
    raise ValueError(f"unknown KL estimator {estimator!r}; expected 'k1', 'k2' or 'k3'.")


@torch.no_grad()
def kl_stats(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean per-response KL(pi || pi_ref) with every estimator: sum over real tokens, mean over the batch.

    Shape: logprobs, ref_logprobs, mask (B, T). Keys: kl_k1, kl_k2, kl_k3. A sequence-level KL (the sum) is what
    the reward penalises and what the adaptive controller targets (Ziegler et al. 2019, section 2.2).
    """
    stats: dict[str, float] = {}
    for est in ("k1", "k2", "k3"):
        per_response = masked_sum(kl_per_token(logprobs, ref_logprobs, est), mask, dim=1)
        stats[f"kl_{est}"] = per_response.mean().item()
    return stats
