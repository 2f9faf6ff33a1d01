from __future__ import annotations

import copy
import json
import pickle
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from rlhf_lib.config import PPOConfig
from rlhf_lib.config.async_rollouts import AsyncRolloutsConfig
from rlhf_lib.models import build_policy, build_scalar_model
from rlhf_lib.ppo import checkpoint as ckpt
from rlhf_lib.ppo.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint, save_checkpoint
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(8)]
# batch 6 of 8 prompts: a checkpoint lands mid-pass, so the sampler's order and position matter;
# target_kl 1.0 moves the adaptive beta every iteration, so the controller's state matters.
CFG = PPOConfig(batch_size=6, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3, target_kl=1.0)
# Every piece of running state: a shared value head in warm-up, running reward whitening, the RM offset, a decaying
# learning rate; and the critic-free path, whose groups repeat prompts.
CFGS = {
    "separate": CFG,
    "shared": CFG.model_copy(update=dict(critic="shared", critic_warmup=1, whiten_rewards=True, rm_offset_samples=12,
                                         lr_schedule="linear", iterations=4, gradient_accumulation_steps=3)),
    "rloo": CFG.model_copy(update=dict(advantage_estimator="rloo", group_size=3, missing_eos_penalty=1.0)),
    "lora": CFG.model_copy(update=dict(lora=True, lora_r=2, lr=1e-2)),
    # async rollouts: the checkpoint holds the rollouts in flight, sampled by weights older than its own
    "async1": CFG.model_copy(update=dict(async_rollouts=AsyncRolloutsConfig(staleness=1))),
    "async2_lora": CFG.model_copy(update=dict(async_rollouts=AsyncRolloutsConfig(staleness=2), lora=True, lora_r=2, lr=1e-2)),
}


def _fresh_trainer(tokenizer, cfg: PPOConfig = CFG) -> PPOTrainer:
    """A trainer built from scratch with the same initial weights every time, as after a process restart."""
    policy = build_policy(tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0)
    torch.manual_seed(0)
    rm = build_scalar_model(policy, seed=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    value = copy.deepcopy(rm) if cfg.has_critic and cfg.critic == "separate" else None
    models = PPOModels(policy=policy, ref=copy.deepcopy(policy), reward=rm, value=value, tokenizer=tokenizer)
    return PPOTrainer(models, PROMPTS, cfg, max_prompt_tokens=32)


def _stats(trainer: PPOTrainer, n: int) -> list[dict[str, float]]:
    return [{k: v for k, v in trainer.step()[1].items() if not k.startswith("time/")} for _ in range(n)]


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("variant", CFGS)
def test_resume_is_bit_identical_to_an_uninterrupted_run(tiny_tokenizer, tmp_path, variant):
    cfg = CFGS[variant]
    a = _fresh_trainer(tiny_tokenizer, cfg)
    a_stats = _stats(a, 3)

    b = _fresh_trainer(tiny_tokenizer, cfg)
    b_stats = _stats(b, 1)
    assert b_stats[0] == a_stats[0]
    path = save_checkpoint(b, checkpoint_dir(tmp_path, b.iteration), extra={"reward_ema": 0.25})
    assert path == tmp_path / "iter_000001"
    b_rest = _stats(b, 2)  # keep going after the save: saving must not disturb the run itself
    assert b_rest == a_stats[1:]

    # Between save and load the process "restarts": every global RNG moves on and a new trainer is built.
    random.random(), np.random.rand(), torch.rand(3)
    c = _fresh_trainer(tiny_tokenizer, cfg)
    extra = load_checkpoint(c, path)
    assert extra == {"reward_ema": 0.25}
    assert c.iteration == 1
    assert c.models.policy.lm_head.weight is c.models.policy.transformer.wte.weight  # tied weights stay tied
    c_stats = _stats(c, 2)

    assert c_stats == a_stats[1:]
    assert c.iteration == a.iteration == 3
    assert c.kl_ctl.state_dict() == a.kl_ctl.state_dict()
    _assert_same_weights(c.models.policy, a.models.policy)
    _assert_same_weights(c.critic.module, a.critic.module)
    assert c.extra_state() == a.extra_state()
    sa, sc = a.optimizer.state_dict(), c.optimizer.state_dict()
    assert sa["param_groups"] == sc["param_groups"]
    for pid in sa["state"]:
        for k, v in sa["state"][pid].items():
            assert v.dtype == sc["state"][pid][k].dtype and torch.equal(v, sc["state"][pid][k]), (pid, k)
    assert torch.equal(c.generator.get_state(), a.generator.get_state())
    assert (c.sampler.order, c.sampler.pos) == (a.sampler.order, a.sampler.pos)

    # Control: without the checkpoint, a fresh trainer does not reproduce iterations 2 and 3.
    assert _stats(_fresh_trainer(tiny_tokenizer, cfg), 2) != a_stats[1:]


def test_global_rngs_are_restored(tiny_tokenizer, tmp_path):
    trainer = _fresh_trainer(tiny_tokenizer)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.randn()  # cached gaussians are part of the state
    save_checkpoint(trainer, tmp_path / "ck")
    expected = (random.random(), random.gauss(0, 1), np.random.rand(4).tolist(), np.random.randn(), torch.rand(4))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    load_checkpoint(trainer, tmp_path / "ck")
    got = (random.random(), random.gauss(0, 1), np.random.rand(4).tolist(), np.random.randn(), torch.rand(4))
    assert got[:4] == expected[:4] and torch.equal(got[4], expected[4])


def test_no_pickle_on_save_or_load(tiny_tokenizer, tmp_path, monkeypatch):
    trainer = _fresh_trainer(tiny_tokenizer)
    trainer.step()

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used")

    with monkeypatch.context() as m:
        for name in ("dumps", "dump"):
            m.setattr(pickle, name, forbidden)
        m.setattr(torch, "save", forbidden)
        save_checkpoint(trainer, tmp_path / "ck")
    with monkeypatch.context() as m:
        for name in ("loads", "load"):
            m.setattr(pickle, name, forbidden)
        m.setattr(torch, "load", forbidden)
        load_checkpoint(_fresh_trainer(tiny_tokenizer), tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == sorted(ckpt.FILES)
    json.loads((tmp_path / "ck" / "state.json").read_text())  # plain JSON


def test_a_failed_save_is_never_complete(tiny_tokenizer, tmp_path, monkeypatch):
    # The marker is written last: a save that dies half-way leaves a directory that nothing loads or picks.
    trainer = _fresh_trainer(tiny_tokenizer)
    save_checkpoint(trainer, tmp_path / "iter_000001")
    calls = []

    def failing_save_file(tensors, filename, metadata=None):
        calls.append(filename)
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", failing_save_file)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(trainer, tmp_path / "iter_000002")
    with pytest.raises(OSError, match="disk full"):  # an overwrite loses its marker first
        save_checkpoint(trainer, tmp_path / "iter_000001")
    assert len(calls) == 2
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(ValueError, match="missing file COMPLETE"):
        load_checkpoint(trainer, tmp_path / "iter_000002")


@pytest.mark.parametrize("missing", ckpt.FILES)
def test_missing_file_is_a_value_error_naming_it(tiny_tokenizer, tmp_path, missing):
    trainer = _fresh_trainer(tiny_tokenizer)
    path = save_checkpoint(trainer, tmp_path / "ck")
    (path / missing).unlink()
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        load_checkpoint(trainer, path)


def test_mismatched_parameter_names_are_a_value_error(tiny_tokenizer, tmp_path):
    trainer = _fresh_trainer(tiny_tokenizer)
    trainer.step()
    path = save_checkpoint(trainer, tmp_path / "ck")
    tensors = load_file(str(path / "policy.safetensors"))
    tensors["transformer.wpe.renamed"] = tensors.pop("transformer.wpe.weight")
    save_file(tensors, str(path / "policy.safetensors"))

    fresh = _fresh_trainer(tiny_tokenizer)
    before = copy.deepcopy(fresh.models.value.state_dict())
    with pytest.raises(ValueError, match=r"policy\.safetensors.*transformer\.wpe\.weight.*transformer\.wpe\.renamed"):
        load_checkpoint(fresh, path)
    assert fresh.iteration == 0  # validation happens before anything is restored
    _assert_same_weights_dict(before, fresh.models.value.state_dict())


def _assert_same_weights_dict(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_latest_checkpoint_picks_the_newest_complete_one(tiny_tokenizer, tmp_path):
    assert latest_checkpoint(tmp_path / "nothing") is None
    assert latest_checkpoint(tmp_path) is None
    trainer = _fresh_trainer(tiny_tokenizer)
    for it in (2, 10, 11):
        save_checkpoint(trainer, checkpoint_dir(tmp_path, it))
    (tmp_path / "iter_000011" / "COMPLETE").unlink()  # a crashed save
    (tmp_path / "iter_000012").mkdir()  # one that crashed at once
    (tmp_path / "notes").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "iter_000010"
