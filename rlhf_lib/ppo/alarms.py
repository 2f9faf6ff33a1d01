"""Alarms: rules over the per-iteration PPO metrics that flag the known ways an RLHF run goes wrong.

Each rule reads the dashboard metrics of `PPOTrainer` (names as logged) and the recent history of a few of
them. A rule that fires returns an `Alarm`; the stage logs it as a Prefect warning and an MLflow tag, the eval
report lists it, and `ppo.stop_on_alarm` ends the loop.

- nan: a non-finite metric (loss, reward, KL...): the update is numerically broken.
- kl_blowup: KL to the reference above `alarm_kl_factor` x `target_kl` (Ziegler et al. 2019 keep it near target).
- entropy_collapse: mean token entropy under `alarm_entropy_min` after the warm-up: the policy turned
  deterministic and stops exploring.
- critic_lag: the mean explained variance of the last `alarm_critic_window` iterations under
  `alarm_explained_variance_min` after the warm-up: the value model does not predict returns, so GAE advantages
  are mostly noise. A window, not one iteration: a healthy critic dips for an iteration; one that never learns sits
  at 0.00-0.02 for many (smollm2-hh, 16 iterations, which a threshold of 0 never caught). It fires when the window
  first falls under the threshold and again only after it has recovered, not on every iteration.
- length_explosion: responses running into `max_new_tokens` (mean length above `alarm_length_frac` of it, or most
  of them without EOS).
- is_blowup: async rollouts (`ppo.async_rollouts`) whose truncated importance weights pi_old / mu exceed the cap on
  more than `alarm_truncated_frac` of the tokens: the sampler's policy is too far behind the trainer's for the
  truncated correction to hold.
- reward_hacking: over the last `alarm_window` iterations the score rises while the gold score falls (where a
  judge exists), while one of several reward sources falls (`ppo.rewards`), or while the mean length grows by more
  than half: the policy is exploiting the reward model (or trading one source for another).
  Rise and fall are least-squares trends over the window, not noise: each must exceed `alarm_min_change` and
  `alarm_z` standard errors of the trend, from the sampling noise of each iteration's mean (its `_sem` metric).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from rlhf_lib.config import PPOConfig

# Metrics that are NaN by definition in a sound run: the explained variance when every return is the same (a
# zero-reward control whose policy has not moved from the reference: no reward, no KL). The nan alarm skips them.
UNDEFINED_WHEN_CONSTANT = frozenset({"value/explained_variance"})
# What fires each alarm, for the reference (docs/reference.md).
RULES = {
    "nan": "any metric of the iteration is NaN or infinite; the update steps with a non-finite loss or gradient were "
           "refused, and no checkpoint is written for the iteration",
    "kl_blowup": "`objective/kl` > `ppo.alarm_kl_factor` × `ppo.target_kl`",
    "length_explosion": "`response/length_mean` > `ppo.alarm_length_frac` × `ppo.max_new_tokens` (× `ppo.max_turns` "
                        "with an environment), or "
                        "`response/no_eos_frac` > 0.5",
    "entropy_collapse": "after `ppo.alarm_after` iterations, `policy/entropy` < `ppo.alarm_entropy_min`",
    "critic_lag": "after `ppo.alarm_after` iterations, the mean `value/explained_variance` of the last "
                  "`ppo.alarm_critic_window` iterations < `ppo.alarm_explained_variance_min` (once per episode of "
                  "lag)",
    "is_blowup": "`async/is_truncated_frac` > `ppo.async_rollouts.alarm_truncated_frac` (async rollouts only)",
    "reward_hacking": "over the last `ppo.alarm_window` iterations `objective/score_raw` rises while `objective/gold` "
                      "falls (each a least-squares trend beyond `ppo.alarm_min_change` and `ppo.alarm_z` standard "
                      "errors of the trend, from the metric's `_sem`), or one of several reward "
                      "sources' `objective/score/<name>` falls, or the score rises while `response/length_mean` grows "
                      "by more than half",
}


@dataclass(frozen=True)
class Alarm:
    name: str
    iteration: int
    message: str

    def __str__(self) -> str:
        return f"iteration {self.iteration}: {self.message}"


def _slope(values: list[float]) -> float:
    """Least-squares slope of `values` against 0..n-1 (0 for fewer than 2 points)."""
    n = len(values)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(values) / n
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / sum((i - mx) ** 2 for i in range(n))


def trend_noise(sems: list[float]) -> float:
    """Standard error of the least-squares change over a window (slope x (n - 1)) when each point is a mean with
    standard error `sems[i]` and no trend: (n - 1) x sqrt(sum_i (x_i - mean x)^2 sem_i^2) / sum_i (x_i - mean x)^2.

    Example: 3 points, each sem 0.1 -> x - mean x = -1, 0, 1 -> 2 x sqrt(0.02) / 2 = 0.14142."""
    n = len(sems)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2
    sxx = sum((i - mx) ** 2 for i in range(n))
    return (n - 1) * math.sqrt(sum((i - mx) ** 2 * s * s for i, s in enumerate(sems))) / sxx


class AlarmMonitor:
    """Feed it each iteration's metrics; it returns the alarms that fire on that iteration."""

    def __init__(self, cfg: PPOConfig):
        self.cfg = cfg
        # With several reward sources, each one's raw score: a rising sum bought by a falling source is flagged.
        self.sources = [f"objective/score/{r.name}" for r in cfg.rewards] if len(cfg.rewards) > 1 else []
        keys = ("objective/score_raw", "objective/gold", "response/length_mean", *self.sources)
        keys += tuple(f"{k}_sem" for k in keys if k != "response/length_mean")
        self.history: dict[str, deque[float]] = {k: deque(maxlen=cfg.alarm_window) for k in keys}
        self.explained_variance: deque[float] = deque(maxlen=cfg.alarm_critic_window)
        self.critic_lagging = False

    def check(self, iteration: int, stats: dict[str, float]) -> list[Alarm]:
        c = self.cfg
        for key, window in self.history.items():
            if key in stats and math.isfinite(stats[key]):
                window.append(stats[key])
        alarms = []
        bad = sorted(k for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v)
                     and not (k in UNDEFINED_WHEN_CONSTANT and math.isnan(v)))
        if bad:
            alarms.append(Alarm("nan", iteration, f"non-finite {', '.join(bad)}"))
        kl = stats.get("objective/kl", 0.0)
        if kl > c.alarm_kl_factor * c.target_kl:
            alarms.append(Alarm("kl_blowup", iteration,
                                f"KL {kl:.2f} > {c.alarm_kl_factor:g} x target {c.target_kl:g} nats"))
        length, no_eos = stats.get("response/length_mean", 0.0), stats.get("response/no_eos_frac", 0.0)
        if length > c.alarm_length_frac * c.policy_tokens or no_eos > 0.5:
            alarms.append(Alarm("length_explosion", iteration,
                                f"mean length {length:.1f} of max {c.policy_tokens}, {no_eos:.0%} without EOS"))
        if iteration >= c.alarm_after:
            entropy = stats.get("policy/entropy", math.inf)
            if entropy < c.alarm_entropy_min:
                alarms.append(Alarm("entropy_collapse", iteration, f"entropy {entropy:.3f} < {c.alarm_entropy_min:g}"))
            alarms += self._critic_lag(iteration, stats.get("value/explained_variance"))
        truncated = stats.get("async/is_truncated_frac", 0.0)
        if truncated > c.async_rollouts.alarm_truncated_frac:
            alarms.append(Alarm("is_blowup", iteration, f"{truncated:.0%} of the tokens' importance weights above the "
                                f"cap {c.async_rollouts.is_cap:g} (max {stats.get('async/is_weight_max', 0.0):.3g})"))
        alarms += self._reward_hacking(iteration)
        return alarms

    def _critic_lag(self, iteration: int, ev: float | None) -> list[Alarm]:
        """critic_lag when the window of explained variances (after the warm-up; a NaN, undefined for constant
        returns, is skipped) is full and its mean under the threshold, the first iteration it is: a lag is one alarm,
        and another only after the mean has risen to the threshold again. No critic (GRPO, RLOO): nothing."""
        if ev is None or math.isnan(ev):
            return []
        window = self.explained_variance
        window.append(ev)
        mean = sum(window) / len(window)
        lagging = len(window) == window.maxlen and mean < self.cfg.alarm_explained_variance_min
        fired, self.critic_lagging = lagging and not self.critic_lagging, lagging
        if not fired:
            return []
        return [Alarm("critic_lag", iteration, f"explained variance {mean:.2f} over the last {len(window)} iterations "
                                               f"< {self.cfg.alarm_explained_variance_min:g}")]

    def _change(self, key: str) -> float | None:
        """The least-squares change of `key` over a full window, or None while the window is filling."""
        values = list(self.history[key])
        return _slope(values) * (len(values) - 1) if len(values) == self.cfg.alarm_window else None

    def _moves(self, key: str, sign: float = 1.0) -> bool:
        """Whether `key`'s change over the window (times `sign`) exceeds both `alarm_min_change` and `alarm_z`
        standard errors of the change (from the `<key>_sem` of each iteration; 0 where it is not logged)."""
        change = self._change(key)
        if change is None:
            return False
        sems = list(self.history[f"{key}_sem"])
        noise = trend_noise(sems) if len(sems) == self.cfg.alarm_window else 0.0
        return sign * change >= max(self.cfg.alarm_min_change, self.cfg.alarm_z * noise)

    def _reward_hacking(self, iteration: int) -> list[Alarm]:
        score, gold, length = (list(self.history[k]) for k in
                               ("objective/score_raw", "objective/gold", "response/length_mean"))
        if not self._moves("objective/score_raw"):
            return []
        if self._moves("objective/gold", -1.0):
            return [Alarm("reward_hacking", iteration, f"RM score rising ({score[0]:.2f} -> {score[-1]:.2f}) while "
                                                       f"gold falls ({gold[0]:.2f} -> {gold[-1]:.2f})")]
        for key in self.sources:
            if self._moves(key, -1.0):
                part = list(self.history[key])
                return [Alarm("reward_hacking", iteration, f"summed score rising ({score[0]:.2f} -> {score[-1]:.2f}) "
                                                           f"while {key} falls ({part[0]:.2f} -> {part[-1]:.2f})")]
        if len(length) == len(score) and length[0] > 0 and length[-1] > 1.5 * length[0]:
            return [Alarm("reward_hacking", iteration, f"RM score rising while length grows "
                                                       f"{length[0]:.1f} -> {length[-1]:.1f} tokens")]
        return []
