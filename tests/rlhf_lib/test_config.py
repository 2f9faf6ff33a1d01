from __future__ import annotations

import pytest

from pydantic import ValidationError

from rlhf_lib.config import ConfigError, PipelineConfig, PPOConfig, build_config


def test_defaults_validate_and_sets_are_typed():
    cfg = build_config([("preset demo", {})], ["ppo.kl_coef=0.123", "ppo.adaptive_kl=false", "name=x"])
    assert cfg.ppo.kl_coef == 0.123 and cfg.ppo.adaptive_kl is False and cfg.name == "x"


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown config key 'ppo.kl_coeff'"):
        build_config([("preset demo", {})], ["ppo.kl_coeff=0.1"])


def test_wrong_type_names_key_and_origin():
    with pytest.raises(ConfigError, match=r"my.yaml: config key 'sft.epochs'"):
        build_config([("my.yaml", {"sft": {"epochs": "many"}})])


def test_set_needs_key_value():
    with pytest.raises(ConfigError, match="expected key=value"):
        build_config([("preset demo", {})], ["ppo.kl_coef"])


def test_set_into_a_value_is_refused():
    with pytest.raises(ConfigError, match="is a value, not a section"):
        build_config([("preset demo", {"name": "demo"})], ["name.x=1"])


def test_minibatches_must_divide_batch():
    with pytest.raises(ValueError, match="divisible by ppo.minibatches"):
        PipelineConfig.model_validate({"ppo": {"batch_size": 10, "minibatches": 4}})


def test_layers_merge_in_order():
    cfg = build_config([("a", {"ppo": {"lr": 1.0, "epochs": 2}}), ("b", {"ppo": {"lr": 2.0}})])
    assert cfg.ppo.lr == 2.0 and cfg.ppo.epochs == 2


def test_responses_must_leave_room_for_the_prompt():
    with pytest.raises(ValueError, match=r"ppo.max_new_tokens \(128\) leaves no room"):
        PipelineConfig.model_validate({"ppo": {"max_new_tokens": 128}})


ENV_SOURCE = {"name": "env", "kind": "environment"}


@pytest.mark.parametrize("ppo, message", [
    ({"rewards": [ENV_SOURCE]}, "kind environment needs ppo.environment"),
    ({"environment": "calculator"}, "add its reward to ppo.rewards"),
    ({"max_turns": 3}, "ppo.max_turns=3 needs ppo.environment"),
    ({"environment": "calculator", "rewards": [{**ENV_SOURCE, "url": "http://x"}]}, "url does not apply"),
])
def test_multi_turn_keys_must_agree(ppo, message):
    with pytest.raises(ValidationError, match=message):
        PPOConfig(**ppo)


def test_the_response_budget_of_an_episode():
    single = PPOConfig(max_new_tokens=16)
    assert (single.response_tokens, single.policy_tokens) == (16, 16)
    multi = PPOConfig(max_new_tokens=16, environment="calculator", max_turns=3, rewards=[ENV_SOURCE])
    assert (multi.response_tokens, multi.policy_tokens) == (48, 48)
    capped = multi.model_copy(update={"max_episode_tokens": 40})
    assert (capped.response_tokens, capped.policy_tokens) == (40, 48)


def test_tool_demonstrations_are_an_arithmetic_key_and_leave_other_keys_alone():
    from rlhf_lib.config import DataConfig

    with pytest.raises(ValidationError, match="data.task=arithmetic only"):
        DataConfig(tool="calculator")
    unset = {"tool", "operands", "instruction", "skip_rows", "sft_call_shares", "max_train_rows"}
    assert "tool" not in DataConfig().key() and DataConfig().key() == DataConfig().model_dump(exclude=unset)
    assert DataConfig(task="arithmetic", tool="calculator").key()["tool"] == "calculator"


def test_the_judge_pairs_cap_is_an_eval_key_only_when_set():
    from rlhf_lib.config.stages import EvalConfig

    assert "judge_pairs" not in EvalConfig().key() and EvalConfig().key() == EvalConfig().model_dump(
        exclude={"judge_pairs", "judge", "controls", "group_by"})
    assert EvalConfig(judge_pairs=128).key()["judge_pairs"] == 128
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        EvalConfig(judge_pairs=0)


def test_control_arms_join_the_keys_only_when_asked():
    """eval.controls and ppo.reward_control are in the eval and PPO keys only when set, so runs without controls keep
    the keys they had; an unknown control is refused."""
    from rlhf_lib.config import PPOConfig
    from rlhf_lib.config.stages import EvalConfig

    assert "controls" not in EvalConfig().key()
    assert EvalConfig(controls=["zero_reward"]).key()["controls"] == ["zero_reward"]
    assert "reward_control" not in PPOConfig().key()
    assert PPOConfig(reward_control="shuffled_reward").key()["reward_control"] == "shuffled_reward"
    with pytest.raises(ValidationError, match="zero_reward"):
        EvalConfig(controls=["no_reward"])


def test_an_eval_judge_is_any_source_but_an_environment_and_names_its_model():
    from rlhf_lib.config.stages import EvalConfig

    fn = {"name": "len", "kind": "function", "function": "rlhf_lib.rewards.builtin:length_target"}
    assert EvalConfig(judge=fn).key()["judge"]["function"] == fn["function"] and "judge" not in EvalConfig().key()
    with pytest.raises(ValidationError, match="eval.judge: kind environment scores episodes"):
        EvalConfig(judge={"name": "env", "kind": "environment"})
    with pytest.raises(ValidationError, match="eval.judge: kind model needs model"):
        EvalConfig(judge={"name": "rm", "kind": "model"})
