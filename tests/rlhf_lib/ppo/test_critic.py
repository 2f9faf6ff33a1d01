"""The three critics, dropout, and the update's options: accumulation, early stop, warm-up, ptx."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.lm.generation import encode_prompts, sample
from rlhf_lib.lm.scoring import backbone_hidden, concat
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.critic import Critic, ValueHead, disable_dropout
from rlhf_lib.ppo.types import Rollout
from rlhf_lib.ppo.update import ppo_epochs

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(8)]


def _rollout(tok, policy, critic, n=8, new=6):
    torch.manual_seed(0)
    q, qm = encode_prompts(tok, PROMPTS[:n], 32)
    r, rm, lp = sample(policy, q, qm, max_new_tokens=new, temperature=1.0, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    ro = Rollout(q, qm, r, rm, lp)
    m = rm.bool()
    ro.advantages = torch.where(m, torch.randn(r.shape, generator=torch.Generator().manual_seed(1)), 0.0)
    with torch.no_grad():
        ro.values = critic.values(policy, q, qm, r, rm) if critic.trains else None
    ro.returns = torch.where(m, torch.ones(r.shape), 0.0) if critic.trains else None
    return ro


def _optimizer(policy, critic):
    groups = [{"params": list(policy.parameters()), "name": "policy"}]
    if critic.trains:
        groups.append({"params": list(critic.module.parameters()), "name": "value"})
    return torch.optim.SGD(groups, lr=0.1)


def test_shared_value_head_reads_the_final_hidden_state(tiny_tokenizer, tiny_policy):
    critic = Critic.build("shared", tiny_policy, None)
    torch.nn.init.normal_(critic.module.linear.weight)
    ro = _rollout(tiny_tokenizer, tiny_policy, Critic.build("none", tiny_policy, None))
    q, qm, r, rm = (t.clone() for t in (ro.query, ro.query_mask, ro.response, ro.response_mask))
    with torch.no_grad():
        values = critic.values(tiny_policy, q, qm, r, rm)
        ids, mask = concat(q, qm, r, rm)
        hidden = backbone_hidden(tiny_policy, ids, mask)[:, q.shape[1] - 1 : q.shape[1] + r.shape[1] - 1]
        expected = critic.module(hidden) * rm
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)


def test_value_head_starts_at_zero():
    assert ValueHead(8)(torch.randn(3, 5, 8)).abs().max() == 0


def test_disable_dropout_zeroes_every_dropout(tiny_policy):
    tiny_policy.transformer.drop.p = 0.3
    disable_dropout(tiny_policy)
    assert all(m.p == 0.0 for m in tiny_policy.modules() if isinstance(m, torch.nn.Dropout))
    tiny_policy.train()
    x = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(tiny_policy(x).logits, tiny_policy(x).logits)


@pytest.mark.parametrize("kind", ["separate", "shared"])
def test_gradient_accumulation_gives_the_minibatch_gradient(tiny_tokenizer, tiny_policy, kind):
    value = build_scalar_model(tiny_policy, seed=1) if kind == "separate" else None
    results = []
    for steps in (1, 4):
        policy = copy.deepcopy(tiny_policy)
        critic = Critic.build(kind, policy, copy.deepcopy(value))
        ro = _rollout(tiny_tokenizer, policy, critic)
        cfg = PPOConfig(batch_size=8, minibatches=1, epochs=1, gradient_accumulation_steps=steps, max_new_tokens=6,
                        temperature=1.0)
        opt = _optimizer(policy, critic)
        stats = ppo_epochs(policy, critic, opt, ro, cfg, torch.Generator().manual_seed(0))
        results.append((stats, [p.detach().clone() for p in policy.parameters()]))
    (s1, w1), (s4, w4) = results
    for a, b in zip(w1, w4):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert s1["policy_loss"] == pytest.approx(s4["policy_loss"], abs=1e-5)
    assert s1["value_loss"] == pytest.approx(s4["value_loss"], abs=1e-5)


def test_critic_warmup_moves_only_the_critic(tiny_tokenizer, tiny_policy):
    critic = Critic.build("shared", tiny_policy, None)
    ro = _rollout(tiny_tokenizer, tiny_policy, critic)
    before = copy.deepcopy(tiny_policy.state_dict())
    cfg = PPOConfig(batch_size=8, minibatches=2, epochs=1, max_new_tokens=6, temperature=1.0)
    stats = ppo_epochs(tiny_policy, critic, _optimizer(tiny_policy, critic), ro, cfg,
                       torch.Generator().manual_seed(0), train_policy=False)
    assert all(torch.equal(v, tiny_policy.state_dict()[k]) for k, v in before.items())
    assert critic.module.linear.bias.item() != 0.0  # the head learned toward the returns of 1
    assert "policy_loss" not in stats and "value_loss" in stats


def test_early_stop_ends_the_epochs_at_the_kl_bound(tiny_tokenizer, tiny_policy):
    critic = Critic.build("none", tiny_policy, None)
    ro = _rollout(tiny_tokenizer, tiny_policy, critic)
    cfg = PPOConfig(batch_size=8, minibatches=2, epochs=5, max_new_tokens=6, temperature=1.0,
                    early_stop_kl=1e-9, advantage_estimator="rloo")
    stats = ppo_epochs(tiny_policy, critic, torch.optim.SGD(tiny_policy.parameters(), lr=1.0), ro, cfg,
                       torch.Generator().manual_seed(0))
    # The first minibatch has ratio 1 (approx KL 0); the second sees the first step's drift and stops epoch 1.
    assert stats["epochs"] == 1.0


def test_ptx_term_is_added_to_every_step(tiny_tokenizer, tiny_policy):
    from rlhf_lib.data.collate import sft_batch

    critic = Critic.build("none", tiny_policy, None)
    ro = _rollout(tiny_tokenizer, tiny_policy, critic)
    cfg = PPOConfig(batch_size=8, minibatches=2, epochs=1, max_new_tokens=6, temperature=1.0, ptx_coef=0.5,
                    advantage_estimator="rloo")
    batch = sft_batch(tiny_tokenizer, [PROMPTS[0]], [" Sure, topic 0 is nice."], 64)
    calls = []
    stats = ppo_epochs(tiny_policy, critic, torch.optim.SGD(tiny_policy.parameters(), lr=0.0), ro, cfg,
                       torch.Generator().manual_seed(0), ptx_batch=lambda: calls.append(1) or batch)
    assert len(calls) == 2 and stats["ptx_loss"] > 0
    # With lr 0 the policy is unchanged, so total = policy loss + 0.5 * ptx exactly.
    assert stats["loss"] == pytest.approx(stats["policy_loss"] + 0.5 * stats["ptx_loss"], rel=1e-5)


def test_separate_critic_backward_in_two_parts_gives_the_gradient_of_the_summed_loss(tiny_tokenizer, tiny_policy):
    """The update backpropagates the policy's terms before running the value model (to keep one model's activations
    alive at a time); the step must equal one SGD step on the gradient of the summed loss."""
    from rlhf_lib.lm.masked import masked_mean
    from rlhf_lib.ppo.losses import policy_loss, value_loss

    value = build_scalar_model(tiny_policy, seed=1)
    cfg = PPOConfig(batch_size=8, minibatches=1, epochs=1, max_new_tokens=6, temperature=1.0, ent_coef=0.01,
                    vf_coef=0.5, max_grad_norm=1e9)
    critic = Critic.build("separate", tiny_policy, value)
    ro = _rollout(tiny_tokenizer, tiny_policy, critic)
    ref_policy, ref_value = copy.deepcopy(tiny_policy), copy.deepcopy(value)
    ref_critic = Critic.build("separate", ref_policy, ref_value)

    ppo_epochs(tiny_policy, critic, _optimizer(tiny_policy, critic), ro, cfg, torch.Generator().manual_seed(0))

    ref_policy.train()
    ref_value.train()
    q, qm, r, m = (t.clone() for t in (ro.query, ro.query_mask, ro.response, ro.response_mask))  # not inference
    logprobs, entropy, values = ref_critic.forward(ref_policy, q, qm, r, m, 1.0, True)
    loss = (policy_loss(logprobs, ro.logprobs, ro.advantages, m, cfg.clip_eps)[0] - cfg.ent_coef * masked_mean(entropy, m)
            + cfg.vf_coef * value_loss(values, ro.values, ro.returns, m, cfg.value_clip)[0])
    loss.backward()
    opt = _optimizer(ref_policy, ref_critic)
    opt.step()
    for model, ref in ((tiny_policy, ref_policy), (value, ref_value)):
        for a, b in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
