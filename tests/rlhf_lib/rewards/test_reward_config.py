from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlhf_lib.config import PipelineConfig, PPOConfig
from rlhf_lib.config.rewards import RewardSource


def test_the_default_is_the_reward_stage_model_alone():
    cfg = PPOConfig()
    assert [(r.name, r.kind, r.weight) for r in cfg.rewards] == [("rm", "model", 1.0)]
    assert cfg.reward_model is cfg.rewards[0]


def test_function_and_http_sources_validate():
    cfg = PPOConfig(rewards=[{"name": "acc", "kind": "function", "function": "rlhf_lib.rewards.builtin:exact_match"},
                             {"name": "judge", "kind": "http", "url": "https://rm.example.org/score",
                              "token_env": "RM_TOKEN", "version": "v3", "weight": 0.5}])
    assert cfg.reward_model is None
    assert cfg.rewards[1].describe() == "reward 'judge' (http https://rm.example.org/score)"


@pytest.mark.parametrize("source, message", [
    ({"name": "f", "kind": "function"}, "kind function needs function"),
    ({"name": "h", "kind": "http"}, "kind http needs url"),
    ({"name": "f", "kind": "function", "function": "no_colon"}, "expected package.module:function"),
    ({"name": "h", "kind": "http", "url": "ftp://host/x"}, "expected an http:// or https:// URL"),
    ({"name": "h", "kind": "http", "url": "http:///score"}, "with a host"),
    ({"name": "f", "kind": "function", "function": "m:f", "url": "http://h/"}, "url does not apply to kind function"),
    ({"name": "m", "kind": "model", "params": {"a": 1}}, "params does not apply to kind model"),
    ({"name": "bad name", "kind": "model"}, "use letters, digits"),
    ({"name": "h", "kind": "http", "url": "http://h/", "token_env": "not-a-var"}, "is not an environment variable"),
    ({"name": "x", "kind": "oracle"}, "kind"),
])
def test_bad_sources_name_the_key(source, message):
    with pytest.raises(ValidationError, match=message):
        RewardSource.model_validate(source)


def test_the_list_is_checked_as_a_whole():
    fn = {"kind": "function", "function": "m:f"}
    with pytest.raises(ValidationError, match="at least one reward source"):
        PPOConfig(rewards=[])
    with pytest.raises(ValidationError, match=r"duplicate name\(s\) \['a'\]"):
        PPOConfig(rewards=[{"name": "a", **fn}, {"name": "a", **fn}])
    with pytest.raises(ValidationError, match="at most one source of kind model"):
        PPOConfig(rewards=[{"name": "a", "kind": "model"}, {"name": "b", "kind": "model", "model": "models:/r/1"}])


def test_a_dumped_config_validates_again():
    """Every key is present in a dumped config (a launched job, a Prefect parameter): only non-default values of
    another kind's keys are refused."""
    cfg = PipelineConfig.model_validate({"ppo": {"rewards": [
        {"name": "len", "kind": "function", "function": "rlhf_lib.rewards.builtin:length_target",
         "params": {"target": 12}}]}})
    again = PipelineConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.ppo.rewards == cfg.ppo.rewards
