"""The README documents every config key and every metric the PPO loop logs (DESIGN section 5.10)."""

from __future__ import annotations

import copy
from pathlib import Path

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


def test_every_ppo_metric_is_documented(tiny_tokenizer, tiny_policy):
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer

    rm = build_scalar_model(tiny_policy)
    models = PPOModels(tiny_policy, copy.deepcopy(tiny_policy), rm, copy.deepcopy(rm), tiny_tokenizer)
    cfg = PPOConfig(batch_size=4, minibatches=2, epochs=1, max_new_tokens=4)
    _, stats = PPOTrainer(models, ["\n\nHuman: hi\n\nAssistant:"], cfg, 32).step()
    missing = [k for k in stats if f"`{k}`" not in README]
    assert missing == []
