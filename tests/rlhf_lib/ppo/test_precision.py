"""Placement and precision of PPO's models: fp32 trainables whatever the checkpoint's dtype, frozen models in
`resources.frozen_dtype`, one device for everything, and bf16 autocast with the same numerics in rollout and update.
No GPU needed: placement is pinned on the `meta` device and with device/dtype assertions on the CPU."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.model_dirs import load_causal_lm, load_reward_side, save_model
from rlhf_lib.models import build_policy, build_scalar_model
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from tests.rlhf_lib.ppo.tiny import tiny_models

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(8)]
CFG = PPOConfig(iterations=2, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3)


def _models(tokenizer, policy) -> PPOModels:
    return tiny_models(tokenizer, policy)


def _dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


def test_a_bf16_checkpoint_loads_with_fp32_trainables_by_default(tmp_path, tiny_tokenizer):
    policy = build_policy(tiny_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0)
    save_model(policy.to(torch.bfloat16), tiny_tokenizer, tmp_path / "sft")
    save_model(build_scalar_model(policy), tiny_tokenizer, tmp_path / "rm")
    assert _dtypes(load_causal_lm(tmp_path / "sft")[0]) == {torch.float32}
    assert _dtypes(load_causal_lm(tmp_path / "sft", dtype="auto")[0]) == {torch.bfloat16}  # model.dtype=auto
    loaded, tok = load_causal_lm(tmp_path / "sft")
    reward, value, _ = load_reward_side(tmp_path / "rm", loaded, tok, frozen_dtype=torch.bfloat16)
    assert _dtypes(reward) == {torch.bfloat16} and _dtypes(value) == {torch.float32}


def test_the_ppo_job_loads_trainables_fp32_and_frozen_models_in_frozen_dtype(tmp_path, tiny_tokenizer):
    from rlhf_lib.config import PipelineConfig
    from rlhf_lib.ppo.loop import load_models

    policy = build_policy(tiny_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0)
    save_model(copy.deepcopy(policy).to(torch.bfloat16), tiny_tokenizer, tmp_path / "sft")
    save_model(build_scalar_model(policy).to(torch.bfloat16), tiny_tokenizer, tmp_path / "rm")
    cfg = PipelineConfig.model_validate({"resources": {"frozen_dtype": "bfloat16"}})
    m = load_models(cfg, tmp_path / "sft", tmp_path / "rm")
    assert _dtypes(m.policy) == _dtypes(m.value) == {torch.float32}
    assert _dtypes(m.ref) == _dtypes(m.reward) == {torch.bfloat16}


def test_the_trainer_places_every_model_on_its_device_in_its_dtype(tiny_tokenizer, tiny_policy, monkeypatch):
    # The `meta` device stands in for a GPU: every model and the ptx batches must follow the group's device.
    monkeypatch.setattr(ProcessGroup, "device", property(lambda self: torch.device("meta")))
    cfg = CFG.model_copy(update={"ptx_coef": 0.1})
    trainer = PPOTrainer(_models(tiny_tokenizer, tiny_policy), PROMPTS, cfg, max_prompt_tokens=32,
                         ptx_examples=[("a", "b")], frozen_dtype=torch.bfloat16)
    m = trainer.models
    assert trainer.device == torch.device("meta")
    for name, dtype in (("policy", torch.float32), ("value", torch.float32), ("ref", torch.bfloat16),
                        ("reward", torch.bfloat16)):
        model = getattr(m, name)
        assert {p.device.type for p in model.parameters()} == {"meta"}, name
        assert _dtypes(model) == {dtype}, name
    assert all(v.device.type == "meta" for v in trainer.ptx().values())
    # Fused Adam follows the parameters: its param groups hold the meta tensors.
    assert {p.device.type for g in trainer.optimizer.param_groups for p in g["params"]} == {"meta"}


def test_rollout_tensors_live_on_the_trainer_device_and_gae_runs_in_fp32(tiny_tokenizer, tiny_policy):
    trainer = PPOTrainer(_models(tiny_tokenizer, tiny_policy), PROMPTS, CFG, max_prompt_tokens=32,
                         mixed_precision="bf16", frozen_dtype=torch.bfloat16)
    ro, stats = trainer.step()
    for name in ("query", "query_mask", "response", "response_mask", "logprobs", "ref_logprobs", "values",
                 "raw_scores", "rewards", "advantages", "returns"):
        t = getattr(ro, name)
        assert t.device == trainer.device, name
        if t.is_floating_point():
            assert t.dtype == torch.float32, name  # bf16 models and autocast, fp32 statistics
    assert all(math.isfinite(v) for v in stats.values()), stats


def test_under_bf16_autocast_the_first_minibatch_ratio_is_one(tiny_tokenizer, tiny_policy):
    # Under autocast the old log-probs are recomputed by the update's forward in the same precision, so the very
    # first ratio is 1 as in float32 (the sampling loop's incremental bf16 log-probs would not match).
    cfg = CFG.model_copy(update={"epochs": 1, "minibatches": 1})
    trainer = PPOTrainer(_models(tiny_tokenizer, tiny_policy), PROMPTS, cfg, max_prompt_tokens=32,
                         mixed_precision="bf16")
    _, stats = trainer.step()
    assert abs(stats["policy/ratio_mean"] - 1) < 1e-5
    assert stats["policy/clipfrac"] == 0


def test_bf16_autocast_ppo_learns_like_fp32(tiny_tokenizer):
    # The same run in fp32 and under bf16 autocast: the same samples at the start, close metrics after updates.
    runs = {}
    for precision in ("no", "bf16"):
        policy = build_policy(tiny_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0)
        trainer = PPOTrainer(_models(tiny_tokenizer, policy), PROMPTS, CFG, max_prompt_tokens=32,
                             mixed_precision=precision)
        runs[precision] = [trainer.step()[1] for _ in range(2)]
    assert runs["no"][0]["objective/score_raw"] == pytest.approx(runs["bf16"][0]["objective/score_raw"], abs=0.05)
    assert runs["bf16"][1]["loss/policy"] == pytest.approx(runs["no"][1]["loss/policy"], abs=0.05)


def test_ppo_refuses_fp16_autocast(tiny_tokenizer, tiny_policy):
    with pytest.raises(ValueError, match="bf16 or no"):
        PPOTrainer(_models(tiny_tokenizer, tiny_policy), PROMPTS, CFG, max_prompt_tokens=32,
                   mixed_precision="fp16")
