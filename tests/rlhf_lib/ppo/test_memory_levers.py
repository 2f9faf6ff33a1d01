"""PPO's memory levers give the numbers of the plain computation: chunked log-probs and entropy (values and
gradients), token-budget micro-batches, gradient checkpointing."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.data.collate import token_budget_split
from rlhf_lib.lm.scoring import response_logprobs
from rlhf_lib.models import build_policy
from rlhf_lib.ppo.critic import Critic
from rlhf_lib.ppo.trainer import PPOTrainer
from tests.rlhf_lib.ppo.tiny import tiny_trainer

CFG = PPOConfig(iterations=2, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3, ent_coef=0.01)


def _qwen2(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def _batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    query = torch.randint(2, vocab, (3, 5), generator=g)
    query_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    response = torch.randint(2, vocab, (3, 7), generator=g)
    response_mask = torch.tensor([[1] * 7, [1] * 3 + [0] * 4, [1] * 5 + [0] * 2])
    return query, query_mask, response, response_mask


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_chunked_logprobs_and_entropy_equal_the_full_computation_with_gradients(arch, tiny_tokenizer):
    model = (build_policy(tiny_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0) if arch == "gpt2"
             else _qwen2(len(tiny_tokenizer)))
    batch = _batch(len(tiny_tokenizer))
    results = []
    for chunk in (None, 3):
        model.zero_grad(set_to_none=True)
        lp, ent = response_logprobs(model, *batch, temperature=0.7, with_entropy=True, chunk=chunk)
        (lp.sum() + ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((lp.detach(), ent.detach(), grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4, msg=name)
    assert (lp1[batch[3] == 0] == 0).all()  # padding stays 0


def test_chunked_shared_critic_forward_equals_the_full_one(tiny_tokenizer, tiny_policy):
    critic = Critic.build("shared", tiny_policy, None)
    torch.nn.init.normal_(critic.module.linear.weight, std=0.1)
    batch = _batch(len(tiny_tokenizer))
    full = critic.forward(tiny_policy, *batch, 0.7, train_policy=True, entropy="detached")
    chunked = critic.forward(tiny_policy, *batch, 0.7, train_policy=True, entropy="detached", chunk=2)
    for a, b in zip(full, chunked):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    _, none, _ = critic.forward(tiny_policy, *batch, 0.7, train_policy=True, entropy="none", chunk=2)
    assert none is None


def test_token_budget_split_packs_sorted_rows_under_the_budget():
    # widths 9, 2, 4, 3, 8 sorted: 2, 3, 4, 8, 9. Budget 9: [2, 3, 4] -> 3 x 4 = 12 > 9, so [2, 3] (2 x 3 = 6),
    # then [4] (2 x 8 = 16 > 9 with the 8), [8], [9].
    assert token_budget_split([9, 2, 4, 3, 8], [9, 2, 4, 3, 8], 9) == [[1, 3], [2], [4], [0]]
    assert token_budget_split([5, 5], [5, 5], 100) == [[0, 1]]
    assert token_budget_split([50], [50], 10) == [[0]]  # a row longer than the budget still gets a micro-batch


def _trainer(tokenizer, cfg: PPOConfig) -> PPOTrainer:
    return tiny_trainer(tokenizer, cfg)


def _run(tokenizer, **update) -> list[dict[str, float]]:
    trainer = _trainer(tokenizer, CFG.model_copy(update=update))
    return [{k: v for k, v in trainer.step()[1].items() if not k.startswith("time/")} for _ in range(2)]


@pytest.mark.parametrize("lever", [{"micro_batch_tokens": 40}, {"gradient_checkpointing": True},
                                   {"logprob_chunk": 2}, {"logprob_chunk": None}])
def test_each_memory_lever_gives_the_same_training_run(tiny_tokenizer, lever):
    base, other = _run(tiny_tokenizer), _run(tiny_tokenizer, **lever)
    for a, b in zip(base, other):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (lever, k)


def test_without_the_entropy_bonus_entropy_is_measured_in_the_first_epoch_only(tiny_tokenizer):
    trainer = _trainer(tiny_tokenizer, CFG.model_copy(update={"ent_coef": 0.0}))
    calls = []
    original = trainer.critic.forward

    def spy(*args, **kw):
        calls.append(kw["entropy"])
        return original(*args, **kw)

    trainer.critic.forward = spy
    _, stats = trainer.step()
    # 2 epochs x 2 minibatches: a detached entropy in epoch 0, none in epoch 1, never a gradient through it.
    assert calls == ["detached", "detached", "none", "none"]
    assert stats["policy/entropy"] > 0
