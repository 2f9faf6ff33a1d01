"""docs/reference.md is what `rlhf reference` generates from the code, and every metric the loops log is in the
metric registry it is generated from (docs/architecture.md)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from cli.reference import reference
from rlhf_lib.config import PPOConfig, RewardConfig, SFTConfig
from rlhf_lib.metric_docs import documented

ROOT = Path(__file__).resolve().parent.parent


def test_the_reference_file_is_generated_from_the_code():
    assert (ROOT / "docs" / "reference.md").read_text() == reference(), (
        "docs/reference.md is out of date: run `rlhf reference > docs/reference.md`")


def test_every_config_key_is_in_the_reference():
    from rlhf_lib.config import PipelineConfig

    def keys(model, prefix=""):
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                yield from keys(ann, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}"

    text = reference()
    assert [k for k in keys(PipelineConfig) if f"| `{k}` |" not in text] == []


@pytest.mark.parametrize("options", [{}, {"critic": "shared", "ptx_coef": 0.1, "reward_clip": 1.0},
                                     {"advantage_estimator": "rloo", "group_size": 2},
                                     {"environment": "tests.rlhf_lib.ppo.test_multiturn:ScriptedEnv", "max_turns": 2,
                                      "max_episode_tokens": 32, "rewards": [{"name": "env", "kind": "environment"}]}])
def test_every_ppo_metric_is_documented(tiny_tokenizer, tiny_policy, options):
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer

    cfg = PPOConfig(batch_size=4, minibatches=2, epochs=1, max_new_tokens=4, rm_offset_samples=4, **options)
    rm = build_scalar_model(tiny_policy)
    value = copy.deepcopy(rm) if cfg.has_critic and cfg.critic == "separate" else None
    models = PPOModels(tiny_policy, copy.deepcopy(tiny_policy), rm, value, tiny_tokenizer)
    trainer = PPOTrainer(models, ["\n\nHuman: hi\n\nAssistant:"], cfg, 32, ptx_examples=[("\n\nHuman: hi", " Hello.")])
    _, stats = trainer.step()
    assert [k for k in [*stats, "objective/gold", "ppo/truncated_prompts"] if not documented(k)] == []


def test_every_sft_and_reward_metric_is_documented(tiny_tokenizer, tiny_policy):
    from rlhf_lib.data.records import RankedExample, SFTExample
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.reward import train_reward_model
    from rlhf_lib.sft import train_sft

    logged: list[str] = []
    log = lambda step, metrics: logged.extend(metrics)  # noqa: E731
    sft = [SFTExample("\n\nHuman: hi\n\nAssistant:", " Hello.")] * 2
    final, _ = train_sft(copy.deepcopy(tiny_policy), tiny_tokenizer, sft, SFTConfig(epochs=1, batch_size=2), log)
    ranked = [RankedExample("\n\nHuman: hi\n\nAssistant:", (" Hello.", " Go."))] * 2
    final_rm, _ = train_reward_model(build_scalar_model(tiny_policy), tiny_tokenizer, ranked,
                                     RewardConfig(epochs=1, batch_size=2), log)
    extra = ["sft/truncated_prompts", "sft/truncated_responses", "reward/heldout_accuracy",
             "reward/truncated_prompts", "reward/truncated_responses"]
    assert [k for k in [*logged, *final, *final_rm, *extra] if not documented(k)] == []


def test_families_and_unknown_names():
    assert documented("data/skipped_preferences/empty_reply") and documented("data/rows_sft")
    assert not documented("objective/klx") and not documented("data/skipped_a/b/c")
