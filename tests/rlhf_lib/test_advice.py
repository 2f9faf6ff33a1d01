"""`tiny_defaults`: a pretrained model with keys sized for the tiny built-in GPT-2 gets one message per key; the
shipped presets and fresh models get none; `load_config` shows them as warnings on stderr."""

from __future__ import annotations

import warnings

import pytest

from flows.settings import TinyDefaultsWarning, load_config
from rlhf_lib.config import PipelineConfig
from rlhf_lib.config.advice import tiny_defaults


def _cfg(**sections) -> PipelineConfig:
    return PipelineConfig.model_validate(sections)


def test_a_fresh_model_gets_no_advice():
    assert tiny_defaults(PipelineConfig()) == []


def test_each_tiny_default_is_named_with_its_value_and_a_literature_value():
    msgs = tiny_defaults(_cfg(model={"name_or_path": "gpt2"}))
    # The defaults: sft.lr 1e-3, reward.lr 5e-4, ppo.lr 3e-4, n_positions 128, max_length 96 (SFT and RM).
    assert [m.split("=")[0] for m in msgs] == ["sft.lr", "reward.lr", "ppo.lr", "model.n_positions",
                                               "ppo.logprob_chunk", "sft.max_length", "reward.max_length"]
    assert msgs[0].startswith("sft.lr=0.001 ") and "2e-5" in msgs[0] and "gpt2" in msgs[0]
    assert msgs[2].startswith("ppo.lr=0.0003 ") and "3e-6" in msgs[2]
    assert msgs[3].startswith("model.n_positions=128 ")
    assert all("--preset gpt2-124m" in m for m in msgs)


def test_literature_sized_keys_pass():
    cfg = _cfg(model={"name_or_path": "gpt2", "n_positions": 640}, sft={"lr": 2e-5, "max_length": 640},
               reward={"lr": 5e-5, "max_length": 640}, ppo={"lr": 3e-6, "value_lr": 9e-6, "logprob_chunk": 64})
    assert tiny_defaults(cfg) == []


def test_a_large_critic_rate_is_named():
    cfg = _cfg(model={"name_or_path": "gpt2", "n_positions": 640}, sft={"lr": 2e-5, "max_length": 640},
               reward={"lr": 5e-5, "max_length": 640}, ppo={"lr": 3e-6, "value_lr": 3e-4, "logprob_chunk": 64})
    (msg,) = tiny_defaults(cfg)
    assert msg.startswith("ppo.value_lr=0.0003 ") and "9e-6" in msg


def test_reward_keys_follow_the_reward_base_model():
    # A hub reward model on the demo's fresh policy: only the reward model's keys are sized for a pretrained model.
    msgs = tiny_defaults(_cfg(reward={"name_or_path": "EleutherAI/pythia-410m"}))
    assert [m.split("=")[0] for m in msgs] == ["reward.lr", "reward.max_length"]
    assert "pythia-410m" in msgs[0]


def test_the_keys_of_a_stage_that_trains_nothing_are_not_judged():
    # RL from the pretrained model (sft.max_steps 0) on a function reward (no reward stage): SFT's and the RM's
    # tiny-model defaults do not matter; PPO's do.
    rewards = [{"name": "acc", "kind": "function", "function": "rlhf_lib.rewards.builtin:exact_match"}]
    msgs = tiny_defaults(_cfg(model={"name_or_path": "gpt2"}, sft={"max_steps": 0}, ppo={"rewards": rewards}))
    assert [m.split("=")[0] for m in msgs] == ["ppo.lr", "model.n_positions", "ppo.logprob_chunk"]


def test_lora_ppo_rates_are_not_judged():
    cfg = _cfg(model={"name_or_path": "gpt2", "n_positions": 640}, sft={"lr": 2e-5, "max_length": 640},
               reward={"lr": 5e-5, "max_length": 640}, ppo={"lr": 1e-4, "lora": True, "logprob_chunk": 64})
    assert tiny_defaults(cfg) == []


@pytest.mark.parametrize("preset", ["gpt2-124m", "qwen-0.5b", "pythia-160m", "demo", "micro", "smollm2-hh",
                                    "smollm2-arith"])
def test_shipped_presets_get_no_advice(preset):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TinyDefaultsWarning)
        load_config(preset)


def test_a_pretrained_preset_is_not_told_to_start_from_itself():
    (msg,) = tiny_defaults(load_config("qwen-0.5b", None, ["sft.lr=1e-3"]))
    assert msg.startswith("sft.lr=0.001 ") and "--preset qwen-0.5b" not in msg
    assert "the qwen-0.5b preset itself is sized for it (an override changed the key)" in msg
    assert "--preset smollm2-hh" in msg and "--preset gpt2-124m" in msg


def test_load_config_warns_once_per_key():
    with pytest.warns(TinyDefaultsWarning) as got:
        load_config("demo", None, ["model.name_or_path=gpt2"])
    texts = [str(w.message) for w in got if w.category is TinyDefaultsWarning]
    # The demo preset's own reward.lr (1e-3) is named, not the schema default.
    assert any(t.startswith("reward.lr=0.001 ") for t in texts) and len(texts) == 7


def test_dpo_keys_are_advised_only_when_dpo_runs():
    assert not [m for m in tiny_defaults(_cfg(model={"name_or_path": "gpt2"})) if m.startswith("dpo.")]
    cfg = _cfg(model={"name_or_path": "gpt2"}, dpo={"enabled": True})
    msgs = [m for m in tiny_defaults(cfg) if m.startswith("dpo.")]
    assert [m.split("=")[0] for m in msgs] == ["dpo.lr", "dpo.max_length"] and "1e-6" in msgs[0]
