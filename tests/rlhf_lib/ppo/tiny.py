"""The tiny four-model PPO setup the trainer tests share: a 1-layer GPT-2 policy, its reference copy, a reward
model with a random head (so scores vary) and a value model copied from it."""

from __future__ import annotations

import copy

import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.models import build_policy, build_scalar_model
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(8)]


def tiny_models(tokenizer, policy=None) -> PPOModels:
    policy = policy or build_policy(tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0)
    torch.manual_seed(0)
    rm = build_scalar_model(policy, seed=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    return PPOModels(policy=policy, ref=copy.deepcopy(policy), reward=rm, value=copy.deepcopy(rm),
                     tokenizer=tokenizer)


def tiny_trainer(tokenizer, cfg: PPOConfig, **kw) -> PPOTrainer:
    """A trainer of `tiny_models` on `PROMPTS`; `kw` goes to `PPOTrainer` (mixed_precision, frozen_dtype, ...)."""
    return PPOTrainer(tiny_models(tokenizer), PROMPTS, cfg, max_prompt_tokens=32, **kw)
