"""The controllers of the KL coefficient beta in PPO's per-token penalty (the estimators: `rlhf_lib.lm.kl`)."""

from __future__ import annotations

from typing import Any


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
