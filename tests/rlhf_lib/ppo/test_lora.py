"""LoRA PPO: adapters train, base weights do not, the reference is the policy with adapters off, export merges."""

from __future__ import annotations

import copy
import math

import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(8)]
CFG = PPOConfig(iterations=2, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-2, lora=True, lora_r=4,
                rm_offset_samples=0)


def _trainer(tokenizer, policy, cfg=CFG):
    rm = build_scalar_model(policy, seed=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    value = copy.deepcopy(rm) if cfg.critic == "separate" else None
    return PPOTrainer(PPOModels(policy, None, rm, value, tokenizer), PROMPTS, cfg, max_prompt_tokens=32)


def test_only_adapters_train_and_the_reference_is_the_base_policy(tiny_tokenizer, tiny_policy):
    base = copy.deepcopy(tiny_policy)
    trainer = _trainer(tiny_tokenizer, tiny_policy)
    assert trainer.models.ref is None
    trained = [n for n, p in trainer.models.policy.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    ro, stats = trainer.step()
    assert abs(stats["objective/kl"]) < 1e-4  # iteration 0: adapters are a no-op (B = 0)
    assert all(math.isfinite(v) for v in stats.values())
    ro, stats = trainer.step()
    assert abs(stats["objective/kl"]) > 1e-6  # the adapters moved the policy away from the reference
    # The reference log-probs are exactly those of the untouched base model.
    from rlhf_lib.lm.scoring import response_logprobs

    with torch.no_grad():
        expected, _ = response_logprobs(base, ro.query, ro.query_mask, ro.response, ro.response_mask, CFG.temperature)
    torch.testing.assert_close(ro.ref_logprobs, expected, atol=1e-5, rtol=1e-5)
    # Base weights never moved.
    base_sd = base.state_dict()
    for name, t in trainer.models.policy.state_dict().items():
        plain = name.replace("base_layer.", "")
        if "lora_" not in name and plain in base_sd:
            assert torch.equal(t, base_sd[plain]), name


def test_export_merges_the_adapters_into_a_plain_model(tiny_tokenizer, tiny_policy):
    trainer = _trainer(tiny_tokenizer, tiny_policy)
    trainer.step()
    trainer.step()
    exported = trainer.export_policy()
    assert type(exported).__name__ == "GPT2LMHeadModel"
    assert not any("lora_" in n for n, _ in exported.named_parameters())
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(exported(x).logits, trainer.models.policy(x).logits, atol=1e-5, rtol=1e-5)


def test_lora_with_a_shared_critic_runs(tiny_tokenizer, tiny_policy):
    trainer = _trainer(tiny_tokenizer, tiny_policy, CFG.model_copy(update={"critic": "shared"}))
    _, stats = trainer.step()
    assert all(math.isfinite(v) for v in stats.values())
    assert trainer.critic.module.linear.weight.abs().sum() > 0  # the head trained on the adapted backbone
