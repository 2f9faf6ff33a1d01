"""KL penalty between the policy pi and the frozen reference pi_ref, and the controllers of its coefficient beta.

Notation: B = batch, T = response length; tokens y_t are sampled from pi, so per token the log-ratio
r_t = log pi(y_t) - log pi_ref(y_t) is a Monte-Carlo sample whose mean is KL(pi || pi_ref).
Estimators follow Schulman, "Approximating KL divergence" (2020 blog post), with ratio rho = pi_ref / pi = e^{-r}.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from rlhf_lib.ppo.masked import masked_sum

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


class AdaptiveKLController:
    """Log-space proportional controller of the KL coefficient beta (Ziegler et al. 2019, section 2.2).

    e_t = clip(KL_t / KL_target - 1, -0.2, 0.2);  beta_{t+1} = beta_t * (1 + K_beta * e_t),
    with K_beta = n_steps / horizon, as in their lm-human-preferences code (and TRL): the gain scales with the
    number of samples seen since the last update, so beta moves by the same amount per sample whatever the batch.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if target <= 0:
            raise ValueError(f"target KL must be > 0, got {target}.")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}.")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Multiply beta by 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon."""
        # The clip bounds the step when KL is far from target (e.g. a KL spike), keeping beta stable.
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = int(state["horizon"])


class FixedKLController:
    """Constant KL coefficient beta, with the interface of `AdaptiveKLController` (InstructGPT uses a fixed beta)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: beta is fixed."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
