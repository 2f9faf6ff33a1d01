"""The report renders user-data results (no gold judge) without crashing, and labels who judged each win rate."""

from __future__ import annotations

from stages.report import NO_JUDGE, metrics_table, render_html

USER_METRICS = {"reward_mean": 0.3, "reward_mean_sft": 0.1, "rm_win_rate_vs_sft": 0.75, "kl_to_ref": 1.2,
                "response_length_mean": 9.0, "response_length_mean_sft": 11.0, "no_eos_frac": 0.0,
                "gold_reward_mean": None, "gold_reward_mean_sft": None, "win_rate_vs_sft": None,
                "truncated_prompts": 3, "reward_model_accuracy": 0.6}


def test_metrics_table_without_a_judge():
    rows = {r["metric"]: r for r in metrics_table(USER_METRICS)}
    assert rows["gold reward (judge)"]["PPO policy"] == NO_JUDGE and rows["gold reward (judge)"]["SFT"] == NO_JUDGE
    assert rows["win rate vs SFT (gold judge)"]["PPO policy"] == NO_JUDGE
    assert rows["win rate vs SFT (RM-judged: the proxy PPO optimised)"]["PPO policy"] == 0.75
    assert rows["RM reward"] == {"metric": "RM reward", "PPO policy": 0.3, "SFT": 0.1}


def test_metrics_table_has_a_row_per_reward_source():
    metrics = USER_METRICS | {"reward_rm_mean": 0.5, "reward_rm_mean_sft": 0.2, "reward_length_mean": -0.4,
                              "reward_length_mean_sft": -0.6, "reward_model_accuracy": 0.6}
    rows = {r["metric"]: r for r in metrics_table(metrics)}
    assert rows["reward (weighted sum of the sources)"]["PPO policy"] == 0.3
    assert rows["reward source length"] == {"metric": "reward source length", "PPO policy": -0.4, "SFT": -0.6}
    assert rows["reward source rm"]["SFT"] == 0.2 and "RM reward" not in rows


def test_metrics_table_with_a_judge():
    metrics = USER_METRICS | {"gold_reward_mean": 0.5, "gold_reward_mean_sft": -0.5, "win_rate_vs_sft": 0.8}
    rows = {r["metric"]: r for r in metrics_table(metrics)}
    assert rows["gold reward (judge)"] == {"metric": "gold reward (judge)", "PPO policy": 0.5, "SFT": -0.5}
    assert rows["win rate vs SFT (gold judge)"]["PPO policy"] == 0.8


def test_user_data_report_renders_without_gold():
    samples = [{"prompt": "\n\nHuman: hi\n\nAssistant:", "sft_response": " a", "ppo_response": " b",
                "sft_rm_score": 0.1, "ppo_rm_score": 0.2, "sft_gold": None, "ppo_gold": None}]
    history = {"objective/score": [(0, 0.1), (1, 0.2)], "objective/kl": [(0, 0.0), (1, 0.5)]}
    html = render_html({"name": "hh", "lineage": {"data": "hh-rlhf"}, "metrics": USER_METRICS}, history, samples,
                       {"PPO policy": [3.0, 4.0], "SFT": [5.0]}, [])
    assert NO_JUDGE in html and "RM-judged" in html and "Human: hi" in html


def test_a_multi_turn_sample_reads_one_turn_per_line():
    samples = [{"prompt": "What is 1 + 2?", "ppo_turns": "policy: <calc>1 + 2</calc> | tool: 3 | policy: 3. (reward 1)"}]
    html = render_html({"name": "tool", "lineage": {}, "metrics": USER_METRICS}, {}, samples, None, [])
    assert "policy: &lt;calc&gt;1 + 2&lt;/calc&gt;<br>tool: 3<br>policy: 3. (reward 1)" in html


def test_baselines_table_puts_ppo_beside_sft_and_each_best_of_n():
    from stages.report_best_of import baselines_table, overoptimisation_heldout_png

    assert baselines_table(USER_METRICS) == [] and overoptimisation_heldout_png(USER_METRICS) is None
    metrics = USER_METRICS | {"gold_reward_mean": 0.5, "gold_reward_mean_sft": 0.2, "win_rate_vs_sft": 0.7,
                              "best_of_prompts": 4.0, "best_of_4_kl": 0.636, "best_of_4_reward_mean": 0.4,
                              "best_of_4_gold_mean": 0.45, "best_of_4_response_length_mean": 10.0,
                              "win_rate_vs_best_of_4": 0.55, "rm_win_rate_vs_best_of_4": 0.4,
                              "best_of_16_kl": 1.835, "best_of_16_reward_mean": 0.6}
    bounds = {"win_rate_vs_sft": (0.6, 0.8), "gold_reward_mean": (0.4, 0.6)}
    rows = {r["policy"]: r for r in baselines_table(metrics, bounds)}
    assert list(rows) == ["SFT", "best-of-4 of SFT", "best-of-16 of SFT", "PPO"]  # n ascending, PPO last
    assert rows["SFT"]["KL to SFT (nats)"] == 0.0 and rows["SFT"]["PPO's judge win rate vs it"] == "0.7 [0.6, 0.8]"
    assert rows["best-of-4 of SFT"]["judge reward"] == 0.45 and rows["best-of-4 of SFT"]["KL to SFT (nats)"] == 0.636
    assert rows["best-of-16 of SFT"]["judge reward"] == "n/a"  # not measured: said so, not left blank
    assert rows["PPO"]["judge reward"] == "0.5 [0.4, 0.6]" and rows["PPO"]["KL to SFT (nats)"] == 1.2
    assert rows["PPO"]["PPO's judge win rate vs it"] == ""
    assert overoptimisation_heldout_png(metrics, bounds)  # a PNG, drawn with a missing judge point
    html = render_html({"name": "hh", "lineage": {}, "metrics": metrics, "intervals": bounds}, {}, [], None, [])
    assert "best-of-16 of SFT" in html and "held-out proxy and judge vs KL" in html


def test_the_dpo_policy_is_one_more_row_of_the_controls_table_with_its_own_verdict():
    from stages.report_controls import controls_heading, controls_table, verdicts

    metrics = USER_METRICS | {"dpo_reward_mean": 0.2, "dpo_kl_to_ref": 0.4, "dpo_response_length_mean": 10.0,
                              "reward_lead_over_dpo": 0.1, "rm_win_rate_vs_dpo": 0.6}
    bounds = {"reward_lead_over_dpo": (0.05, 0.15)}
    rows = controls_table(metrics, bounds)
    assert [r["policy"] for r in rows] == ["PPO", "DPO policy"]
    assert rows[1]["proxy reward"] == 0.2 and rows[1]["KL to SFT (nats)"] == 0.4
    assert verdicts(metrics, bounds) == ["PPO beats the DPO policy under the reward sources (interval above 0): the "
                                         "reward model and sampling bought more than DPO on the same pairs"]
    assert controls_heading(metrics) == ("PPO against the DPO policy (the same pairs, no reward model, no "
                                         "sampling)")
    both = metrics | {"reward_lead_over_zero_reward": -0.1, "zero_reward_reward_mean": 0.4}
    assert [r["policy"] for r in controls_table(both)] == ["PPO", "zero-reward control", "DPO policy"]
    assert controls_heading(both).startswith("PPO against its control arms (the same run, the reward replaced): "
                                             "what the reward taught beyond the shaping; and the DPO policy")
    lo_hi = {"reward_lead_over_dpo": (-0.3, -0.1), "reward_lead_over_zero_reward": (-0.2, -0.05)}
    assert verdicts(both, lo_hi) == [
        "the zero-reward control beats PPO under the reward sources: the shaping alone did better than the reward",
        "the DPO policy beats PPO under the reward sources: DPO on the same pairs did better than the reward model "
        "and PPO"]


def test_every_policy_in_one_table_and_the_win_matrix_reads_each_pair_once():
    """PPO, DPO and a zero-reward control beside SFT and best-of-4 under a judge. The matrix reads a measured
    direction as it is (DPO over the control: 0.6 [0.5, 0.7]) and the other as its complement (the control over
    DPO: 0.4 [0.3, 0.5]; DPO over PPO: 1 - PPO's 0.45 over DPO). Training minutes come from the stages' wall
    seconds; best-of-n trains nothing."""
    from stages.report_policies import policies_table, win_matrix

    assert policies_table(USER_METRICS) == [] and win_matrix(USER_METRICS) == []
    metrics = USER_METRICS | {
        "gold_reward_mean": 0.5, "gold_reward_mean_sft": 0.2, "win_rate_vs_sft": 0.7, "best_of_prompts": 4.0,
        "best_of_4_kl": 0.636, "best_of_4_reward_mean": 0.4, "best_of_4_gold_mean": 0.45,
        "best_of_4_response_length_mean": 10.0, "win_rate_vs_best_of_4": 0.55,
        "dpo_reward_mean": 0.2, "dpo_gold_reward_mean": 0.4, "dpo_kl_to_ref": 0.3, "dpo_response_length_mean": 9.0,
        "dpo_win_rate_vs_sft": 0.65, "win_rate_vs_dpo": 0.45, "dpo_win_rate_vs_best_of_4": 0.52,
        "zero_reward_reward_mean": 0.1, "zero_reward_gold_reward_mean": 0.25, "zero_reward_kl_to_ref": 0.2,
        "zero_reward_response_length_mean": 8.0, "zero_reward_win_rate_vs_sft": 0.5, "win_rate_vs_zero_reward": 0.7,
        "dpo_win_rate_vs_zero_reward": 0.6, "zero_reward_win_rate_vs_best_of_4": 0.4}
    bounds = {"dpo_win_rate_vs_zero_reward": (0.5, 0.7), "win_rate_vs_dpo": (0.35, 0.55)}
    seconds = {"sft": 60.0, "ppo": 600.0, "dpo": 300.0, "zero_reward": 590.0, "reward": 120.0}
    rows = {r["policy"]: r for r in policies_table(metrics, bounds, seconds)}
    assert list(rows) == ["SFT", "best-of-4 of SFT", "PPO", "DPO policy", "zero-reward control"]
    assert [rows[p]["training (min)"] for p in ("SFT", "PPO", "DPO policy", "zero-reward control")] == \
        ["1.0", "10.0", "5.0", "9.8"]
    assert rows["best-of-4 of SFT"]["training (min)"] == "none (4 samples a prompt)"
    assert rows["DPO policy"]["judge win rate vs SFT"] == 0.65 and rows["DPO policy"]["KL to SFT (nats)"] == 0.3
    matrix = {r["win rate of ↓ over →"]: r for r in win_matrix(metrics, bounds)}
    assert list(matrix) == ["PPO", "DPO policy", "zero-reward control"]
    assert matrix["DPO policy"]["zero-reward control"] == "0.6 [0.5, 0.7]"
    assert matrix["zero-reward control"]["DPO policy"] == "0.4 [0.3, 0.5]"
    assert matrix["DPO policy"]["PPO"] == "0.55 [0.45, 0.65]" and matrix["PPO"]["DPO policy"] == "0.45 [0.35, 0.55]"
    assert matrix["PPO"]["best-of-4 of SFT"] == 0.55 and matrix["zero-reward control"]["SFT"] == 0.5
    assert matrix["PPO"]["PPO"] == "" and matrix["zero-reward control"]["PPO"] == "0.3"
    html = render_html({"name": "hh", "lineage": {}, "metrics": metrics, "intervals": bounds,
                        "training_seconds": seconds}, {}, [], None, [])
    assert "Every policy on the same prompts, under the judge" in html and "Paired win rates" in html
    # without a judge the reward sources decide every cell, the SFT column included
    no_judge = {k: v for k, v in metrics.items() if "win_rate" not in k and "gold" not in k} | {
        "rm_win_rate_vs_sft": 0.8, "rm_win_rate_vs_dpo": 0.7, "dpo_rm_win_rate_vs_sft": 0.6,
        "rm_win_rate_vs_zero_reward": 0.9, "zero_reward_rm_win_rate_vs_sft": 0.4,
        "dpo_rm_win_rate_vs_zero_reward": 0.75}
    rows = {r["win rate of ↓ over →"]: r for r in win_matrix(no_judge)}
    assert rows["DPO policy"]["SFT"] == 0.6 and rows["zero-reward control"]["SFT"] == 0.4
    assert rows["PPO"]["SFT"] == 0.8 and rows["zero-reward control"]["DPO policy"] == "0.25"
