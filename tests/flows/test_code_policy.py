"""Which code a deployment run may name: the keys that run code, the host's allow-list (environment and file), the
project's own reward functions always allowed, and the one-line refusal."""

from __future__ import annotations

import pytest

from flows.code_policy import check_deployment_config, code_requests, host_allowed, is_allowed
from rlhf_lib.config import ConfigError, PipelineConfig


def _cfg(**sections) -> PipelineConfig:
    return PipelineConfig.model_validate(sections)


FN = {"name": "f", "kind": "function"}


def test_the_keys_that_run_code_are_found():
    cfg = _cfg(model={"trust_remote_code": True}, reward={"trust_remote_code": True},
               ppo={"rewards": [{"name": "rm", "kind": "model"}, {**FN, "function": "my.mod:score"}]},
               eval={"judge": {**FN, "function": "their.mod:grade"}})
    assert code_requests(cfg) == [("model.trust_remote_code", "model.trust_remote_code"),
                                  ("reward.trust_remote_code", "reward.trust_remote_code"),
                                  ("ppo.rewards[1].function", "function:my.mod:score"),
                                  ("eval.judge.function", "function:their.mod:grade")]
    assert code_requests(PipelineConfig()) == []


def score(prompts, completions, **_):
    return [0.0] * len(completions)


def test_the_host_allow_list_comes_from_its_environment_and_its_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_ALLOW_CODE", "model.trust_remote_code, function:a.b:c")
    (tmp_path / "allow-code.txt").write_text(f"function:{__name__}:*  # all of this module\n\n# nothing else\n")
    allowed = host_allowed(tmp_path)
    assert {"model.trust_remote_code", "function:a.b:c", f"function:{__name__}:*"} <= allowed
    assert is_allowed(f"function:{__name__}:score", allowed) and is_allowed("function:a.b:c", allowed)
    assert not is_allowed(f"function:{__name__}:pytest", allowed)  # imported here, not defined here
    assert not is_allowed("function:a.b:d", allowed) and not is_allowed("reward.trust_remote_code", allowed)
    assert is_allowed("function:rlhf_lib.rewards.builtin:exact_match", host_allowed(tmp_path / "none"))


def test_a_deployment_config_naming_unallowed_code_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_ALLOW_CODE", raising=False)
    cfg = _cfg(ppo={"rewards": [{**FN, "function": "os:system"},
                                {**FN, "name": "g", "function": "rlhf_lib.rewards.builtin:length_target"}]})
    with pytest.raises(ConfigError) as info:
        check_deployment_config(cfg, tmp_path)
    message = str(info.value)
    assert "ppo.rewards[0].function (function:os:system)" in message and "builtin" not in message
    assert "\n" not in message and "RLHF_ALLOW_CODE" in message
    monkeypatch.setenv("RLHF_ALLOW_CODE", "function:os:system")
    check_deployment_config(cfg, tmp_path)  # the host allowed it


ENV_SOURCE = {"name": "env", "kind": "environment"}


def test_an_environment_class_needs_the_hosts_entry_and_the_builtin_does_not(tmp_path, monkeypatch):
    monkeypatch.delenv("RLHF_ALLOW_CODE", raising=False)
    builtin = _cfg(ppo={"environment": "calculator", "rewards": [ENV_SOURCE]})
    assert code_requests(builtin) == []
    check_deployment_config(builtin, tmp_path)
    mine = _cfg(ppo={"environment": "my.envs:Shell", "rewards": [ENV_SOURCE]})
    assert code_requests(mine) == [("ppo.environment", "environment:my.envs:Shell")]
    with pytest.raises(ConfigError, match=r"ppo.environment \(environment:my.envs:Shell\)"):
        check_deployment_config(mine, tmp_path)
    (tmp_path / "allow-code.txt").write_text("environment:my.envs:Shell\n")
    check_deployment_config(mine, tmp_path)  # the host allowed that environment
    calc = _cfg(ppo={"environment": "rlhf_lib.envs.calculator:CalculatorEnv", "rewards": [ENV_SOURCE]})
    (tmp_path / "allow-code.txt").write_text("environment:rlhf_lib.envs.calculator:*\n")
    check_deployment_config(calc, tmp_path)  # the host allowed the classes that module defines
