from __future__ import annotations

import math

from rlhf_lib.config import PPOConfig
from rlhf_lib.intervals import standard_error
from rlhf_lib.ppo.alarms import AlarmMonitor, _slope, trend_noise

CFG = PPOConfig(target_kl=3.0, alarm_kl_factor=4.0, max_new_tokens=32, alarm_window=3, alarm_after=2)
HEALTHY = {"objective/kl": 3.0, "objective/score_raw": 0.5, "policy/entropy": 1.0, "value/explained_variance": 0.5,
           "response/length_mean": 12.0, "response/no_eos_frac": 0.0, "loss/policy": 0.1}


def names(monitor, it, **changes):
    return [a.name for a in monitor.check(it, {**HEALTHY, **changes})]


def test_healthy_metrics_raise_nothing():
    m = AlarmMonitor(CFG)
    assert [names(m, it) for it in range(6)] == [[]] * 6


def test_slope_hand_case():
    # values 1, 2, 4 at x = 0, 1, 2: mean x 1, mean y 7/3; slope = ((-1)(-4/3) + 0 + (1)(5/3)) / 2 = 1.5
    assert math.isclose(_slope([1.0, 2.0, 4.0]), 1.5)


def test_nan_and_kl_blowup_and_length():
    m = AlarmMonitor(CFG)
    assert names(m, 0, **{"loss/policy": float("nan")}) == ["nan"]
    assert names(m, 1, **{"objective/kl": 12.1}) == ["kl_blowup"]  # 12.1 > 4 x 3
    assert names(m, 2, **{"objective/kl": 11.9}) == []
    assert names(m, 3, **{"response/length_mean": 31.0}) == ["length_explosion"]  # 31 > 0.95 x 32
    assert names(m, 4, **{"response/no_eos_frac": 0.6}) == ["length_explosion"]


def test_an_explained_variance_undefined_by_constant_returns_is_no_nan_alarm():
    # A zero-reward control whose policy has not left the reference: every return is 0, Var(R) = 0, EV is NaN by
    # definition (rlhf_lib/ppo/metrics.py). An infinite one, or any other NaN, still fires.
    m = AlarmMonitor(CFG)
    assert names(m, 0, **{"value/explained_variance": float("nan")}) == []
    assert names(m, 1, **{"value/explained_variance": float("inf")}) == ["nan"]
    assert names(m, 2, **{"value/explained_variance": float("nan"), "loss/value": float("nan")}) == ["nan"]


def test_entropy_and_critic_alarms_wait_for_the_warm_up():
    m = AlarmMonitor(CFG.model_copy(update={"alarm_critic_window": 1}))
    low = {"policy/entropy": 0.01, "value/explained_variance": -0.2}
    assert names(m, 1, **low) == []
    assert names(m, 2, **low) == ["entropy_collapse", "critic_lag"]


def critic_alarms(values, **cfg):
    m = AlarmMonitor(PPOConfig(**{"alarm_after": 0, **cfg}))
    return [it for it, ev in enumerate(values)
            if "critic_lag" in names(m, it, **{"value/explained_variance": ev})]


def test_a_critic_stuck_near_zero_fires_once_when_its_window_fills():
    # smollm2-hh: 0.00-0.02 for 16 iterations, which the old rule (one iteration < 0.0) never caught. Window 5,
    # threshold 0.1: the mean of iterations 0-4 is 0.01 < 0.1, so it fires at iteration 4, and not again while stuck.
    stuck = [0.00, 0.02, 0.01, 0.00, 0.02, 0.01, 0.00, 0.02, 0.01, 0.00, 0.02, 0.01, 0.00, 0.02, 0.01, 0.00]
    assert critic_alarms(stuck) == [4]


def test_a_healthy_critic_and_a_one_iteration_dip_raise_nothing():
    # The demo's PPO critic (seed 0, validation, 2026-12-07), and a dip to -0.5 for one iteration among 0.6s:
    # the windowed means are 0.298 at iteration 4 and then higher; (0.6 x 4 - 0.5) / 5 = 0.38.
    demo = [0.01, 0.31, 0.33, 0.46, 0.38, 0.50, 0.62, 0.64, 0.59, 0.78, 0.74, 0.78, 0.89]
    assert critic_alarms(demo) == []
    assert critic_alarms([0.6, 0.6, -0.5, 0.6, 0.6, 0.6, 0.6]) == []


def test_a_critic_that_recovers_and_lags_again_fires_again():
    # means of 5: it 4 -> 0.0 (fires); it 9 -> 0.5 (recovered); it 14 -> 0.0 again (fires)
    assert critic_alarms([0.0] * 5 + [0.5] * 5 + [0.0] * 5) == [4, 14]
    # undefined (NaN: constant returns) iterations are skipped, not counted as lag
    assert critic_alarms([float("nan")] * 8) == []


def test_no_critic_no_critic_alarm():
    m = AlarmMonitor(PPOConfig(alarm_after=0, alarm_critic_window=1))
    stats = {k: v for k, v in HEALTHY.items() if k != "value/explained_variance"}  # GRPO logs none
    assert [a.name for it in range(3) for a in m.check(it, stats)] == []


def test_reward_hacking_when_score_rises_and_gold_falls():
    m = AlarmMonitor(CFG)
    for it, (score, gold) in enumerate([(0.1, 0.5), (0.3, 0.4), (0.6, 0.2)]):
        fired = names(m, it, **{"objective/score_raw": score, "objective/gold": gold})
    assert fired == ["reward_hacking"]


def test_reward_hacking_by_length_without_a_judge():
    m = AlarmMonitor(CFG)
    for it, (score, length) in enumerate([(0.1, 10.0), (0.3, 13.0), (0.6, 16.0)]):
        fired = names(m, it, **{"objective/score_raw": score, "response/length_mean": length})
    assert fired == ["reward_hacking"]  # 16 > 1.5 x 10


def test_rising_score_with_rising_gold_is_fine():
    m = AlarmMonitor(CFG)
    for it, (score, gold) in enumerate([(0.1, 0.1), (0.3, 0.2), (0.6, 0.4)]):
        fired = names(m, it, **{"objective/score_raw": score, "objective/gold": gold})
    assert fired == []


def test_a_flat_score_with_noise_is_not_reward_hacking():
    # score trend over the window: slope 0.005/iter x 2 = 0.01 < alarm_min_change 0.05
    m = AlarmMonitor(CFG)
    for it, (score, gold) in enumerate([(0.74, 0.39), (0.745, 0.35), (0.75, 0.32)]):
        fired = names(m, it, **{"objective/score_raw": score, "objective/gold": gold})
    assert fired == []


def test_trend_noise_and_standard_error_hand_cases():
    # x - mean x = -1, 0, 1 and each sem 0.1: (n - 1) sqrt(0.01 + 0 + 0.01) / sum (x - mean x)^2 = 2 x 0.14142 / 2
    assert math.isclose(trend_noise([0.1, 0.1, 0.1]), 0.141421, rel_tol=1e-5)
    assert trend_noise([0.3]) == 0.0
    assert math.isclose(standard_error([1.0, 2.0, 3.0]), 1 / math.sqrt(3))  # std (n-1) = 1


def test_a_gold_drop_within_its_sampling_noise_is_not_reward_hacking():
    # score +0.5 and gold -0.2 over 3 iterations. Gold's sem 0.15 per iteration: trend noise 0.2121, x 3 = 0.64 > 0.2:
    # noise, no alarm. sem 0.02: noise 0.0283, x 3 = 0.085 < 0.2: the same drop is a trend and fires.
    def run(gold_sem):
        m = AlarmMonitor(CFG)
        for it, (score, gold) in enumerate([(0.1, 0.5), (0.3, 0.4), (0.6, 0.3)]):
            fired = names(m, it, **{"objective/score_raw": score, "objective/score_raw_sem": 0.02,
                                    "objective/gold": gold, "objective/gold_sem": gold_sem})
        return fired
    assert run(0.15) == []
    assert run(0.02) == ["reward_hacking"]
    assert CFG.alarm_z == 3.0


def test_reward_hacking_when_the_sum_rises_and_one_source_falls():
    sources = [{"name": "rm", "kind": "model"},
               {"name": "fmt", "kind": "function", "function": "rlhf_lib.rewards.builtin:required_format"}]
    m = AlarmMonitor(CFG.model_copy(update={"rewards": PPOConfig(rewards=sources).rewards}))
    fired = [names(m, it, **{"objective/score_raw": 0.5 + 0.2 * it, "objective/score/rm": 0.6 + 0.3 * it,
                             "objective/score/fmt": 0.9 - 0.1 * it}) for it in range(3)]
    assert fired == [[], [], ["reward_hacking"]]  # over 3 iterations: sum +0.4, fmt -0.2 (both beyond 0.05)
    steady = AlarmMonitor(CFG.model_copy(update={"rewards": PPOConfig(rewards=sources).rewards}))
    assert [names(steady, it, **{"objective/score_raw": 0.5 + 0.2 * it, "objective/score/rm": 0.6 + 0.3 * it,
                                 "objective/score/fmt": 0.9}) for it in range(3)] == [[], [], []]
