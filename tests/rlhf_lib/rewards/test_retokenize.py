"""A reward model with its own tokenizer scores the policy's samples as text, re-tokenized as in RM training."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.lm.generation import decode_responses, encode_prompts
from rlhf_lib.lm.scoring import sequence_scores
from rlhf_lib.models import build_policy, build_scalar_model, same_tokenizer, train_tokenizer
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from rlhf_lib.reward import score_texts
from rlhf_lib.rewards.retokenize import decode_prompts, retokenized_scores

PROMPTS = ["\n\nHuman: tell me about topic 3\n\nAssistant:", "\n\nHuman: hi there, what is new?\n\nAssistant:"]


@pytest.fixture(scope="module")
def rm_tokenizer():
    """A second tokenizer: another corpus and vocabulary size, so the same text gets different ids."""
    corpus = [f"Human: what about item number {i}? Assistant: item {i} is great, really." for i in range(60)]
    return train_tokenizer(corpus, vocab_size=400)


@pytest.fixture()
def reward_model(rm_tokenizer):
    torch.manual_seed(1)
    rm = build_scalar_model(build_policy(rm_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=96), seed=1)
    torch.nn.init.normal_(rm.score.weight, std=1.0)  # a non-zero head, so scores tell inputs apart
    return rm


def responses(tokenizer):
    """Two hand-made responses: one that ended with EOS, one cut off at max_new_tokens (no EOS), right-padded."""
    done = tokenizer(" topic 3 is nice.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    cut = tokenizer(" Sure, topic", add_special_tokens=False)["input_ids"]
    width = max(len(done), len(cut))
    r = torch.full((2, width), tokenizer.pad_token_id)
    rm = torch.zeros((2, width), dtype=torch.long)
    for i, ids in enumerate((done, cut)):
        r[i, : len(ids)], rm[i, : len(ids)] = torch.tensor(ids), 1
    return r, rm


def test_same_tokenizer(tiny_tokenizer, rm_tokenizer):
    assert same_tokenizer(tiny_tokenizer, copy.deepcopy(tiny_tokenizer))
    assert not same_tokenizer(tiny_tokenizer, rm_tokenizer)


def test_prompts_decode_to_their_text(tiny_tokenizer):
    q, qm = encode_prompts(tiny_tokenizer, PROMPTS, 48)
    assert decode_prompts(tiny_tokenizer, q, qm) == PROMPTS  # byte-level BPE: an exact round trip, padding dropped


def test_scores_equal_the_rm_scoring_the_text_itself(tiny_tokenizer, rm_tokenizer, reward_model):
    q, qm = encode_prompts(tiny_tokenizer, PROMPTS, 48)
    r, rm = responses(tiny_tokenizer)
    got = retokenized_scores(reward_model, rm_tokenizer, tiny_tokenizer, q, qm, r, rm)
    assert decode_responses(tiny_tokenizer, r, rm) == [" topic 3 is nice.", " Sure, topic"]
    # Finished: as in RM training, the RM's own EOS after the response (reward.score_texts appends it).
    finished = score_texts(reward_model, rm_tokenizer, PROMPTS[:1], [" topic 3 is nice."], 96)[0]
    # Cut off at max_new_tokens: scored unfinished, without EOS, as a shared tokenizer would score it.
    ids = rm_tokenizer(PROMPTS[1] + " Sure, topic", add_special_tokens=False)["input_ids"]
    unfinished = sequence_scores(reward_model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0]
    assert torch.allclose(got, torch.stack([finished, unfinished]), atol=1e-5)
    # The policy's ids read directly by this RM would be another (meaningless) score.
    direct = sequence_scores(reward_model, torch.cat([q, r], 1), torch.cat([qm, rm], 1))
    assert not torch.allclose(direct, got)


def test_a_ppo_step_scores_through_the_rm_tokenizer(tiny_tokenizer, tiny_policy, rm_tokenizer, reward_model):
    value = build_scalar_model(tiny_policy)  # the value model reads the policy's ids
    models = PPOModels(tiny_policy, copy.deepcopy(tiny_policy), reward_model, value, tiny_tokenizer,
                       reward_tokenizer=rm_tokenizer)
    trainer = PPOTrainer(models, PROMPTS, PPOConfig(batch_size=2, minibatches=1, epochs=1, max_new_tokens=5), 48)
    ro, stats = trainer.step()
    want = retokenized_scores(reward_model, rm_tokenizer, tiny_tokenizer, ro.query, ro.query_mask, ro.response,
                              ro.response_mask)
    assert torch.allclose(ro.raw_scores, want) and ro.raw_scores.abs().sum() > 0
    # The RM offset (mean score of SFT samples, also read through the RM's tokenizer) is what the reward sees removed.
    assert torch.allclose(ro.scores, want - trainer.rm_offset)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if not k.startswith("time/"))
