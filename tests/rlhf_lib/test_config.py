from __future__ import annotations

import pytest

from rlhf_lib.config import ConfigError, PipelineConfig, build_config


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
