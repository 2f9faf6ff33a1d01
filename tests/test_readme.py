"""The README documents every config key and every metric the PPO loop logs (DESIGN section 5.10)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from pydantic import BaseModel

from rlhf_lib.config import PipelineConfig, PPOConfig

README = (Path(__file__).parent.parent / "README.md").read_text()


def config_keys(model: type[BaseModel] = PipelineConfig, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += config_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def test_every_config_key_is_documented():
    missing = [k for k in config_keys() if f"`{k}`" not in README]
    assert missing == []


@pytest.mark.parametrize("options", [{}, {"critic": "shared", "ptx_coef": 0.1, "reward_clip": 1.0}])
def test_every_ppo_metric_is_documented(tiny_tokenizer, tiny_policy, options):
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer

    cfg = PPOConfig(batch_size=4, minibatches=2, epochs=1, max_new_tokens=4, rm_offset_samples=4, **options)
    rm = build_scalar_model(tiny_policy)
    value = copy.deepcopy(rm) if cfg.critic == "separate" else None
    models = PPOModels(tiny_policy, copy.deepcopy(tiny_policy), rm, value, tiny_tokenizer)
    trainer = PPOTrainer(models, ["\n\nHuman: hi\n\nAssistant:"], cfg, 32, ptx_examples=[("\n\nHuman: hi", " Hello.")])
    _, stats = trainer.step()
    missing = [k for k in stats if f"`{k}`" not in README]
    assert missing == []
