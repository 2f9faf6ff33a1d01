"""A reward model served over text scores rows as PPO's in-process RM does: decoding PPO's token ids to text and
encoding that text again gives the same scores, with a shared tokenizer and with an RM tokenizer of its own."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.data.collate import encode_prompt_response
from rlhf_lib.lm.generation import decode_responses, encode_prompts, ends_with_eos
from rlhf_lib.lm.scoring import sequence_scores
from rlhf_lib.models import build_policy, build_scalar_model, train_tokenizer
from rlhf_lib.rewards import RewardError, TextBatch
from rlhf_lib.rewards.retokenize import RewardScorer, decode_prompts
from rlhf_lib.rewards.text_rm import TextRewardModel

PROMPTS = ["\n\nHuman: tell me about topic 3\n\nAssistant:", "\n\nHuman: hi there, what is new?\n\nAssistant:",
           "\n\nHuman: topic 12?\n\nAssistant:", "\n\nHuman: tell me\n\nAssistant:"]
RESPONSES = [" Sure, topic 3 is nice.", " Sure, topic", " topic 12 is nice. Thanks!", " Thanks"]
FINISHED = [True, False, True, False]  # False: cut off at max_new_tokens, no EOS


def reward_model(tokenizer, n_positions: int = 96):
    rm = build_scalar_model(build_policy(tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=n_positions), seed=1)
    torch.manual_seed(1)
    torch.nn.init.normal_(rm.score.weight, std=1.0)  # a non-zero head, so scores tell inputs apart
    return rm


def rollout_rows(tokenizer):
    """PPO's layout: prompts left-padded (B, P), responses right-padded with EOS where finished (B, R)."""
    q, qm = encode_prompts(tokenizer, PROMPTS, 48)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] * done
           for t, done in zip(RESPONSES, FINISHED)]
    width = max(map(len, ids))
    r = torch.full((len(ids), width), tokenizer.pad_token_id)
    rm = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        r[i, : len(row)], rm[i, : len(row)] = torch.tensor(row), 1
    return q, qm, r, rm


def as_text(tokenizer, q, qm, r, rm) -> TextBatch:
    """What PPO sends a text reward source: the rows decoded, EOS dropped and recorded as `finished`."""
    return TextBatch(decode_prompts(tokenizer, q, qm), decode_responses(tokenizer, r, rm),
                     ends_with_eos(r, rm, tokenizer.eos_token_id).tolist())


def test_decoded_rows_score_as_ppo_scores_them(tiny_tokenizer):
    rm_model = reward_model(tiny_tokenizer)
    rows = rollout_rows(tiny_tokenizer)
    in_process = RewardScorer(rm_model, tiny_tokenizer)(*rows)  # ids [prompt | response (+EOS)], no text
    batch = as_text(tiny_tokenizer, *rows)
    assert batch.completions == RESPONSES and batch.finished == FINISHED
    served = TextRewardModel(rm_model, tiny_tokenizer, batch_size=3)(batch)
    assert isinstance(served[0], float) and len(set(served)) == len(served)  # distinct: the test can tell rows apart
    assert torch.allclose(torch.tensor(served), in_process, atol=1e-5)


def test_rm_with_its_own_tokenizer_scores_as_ppo_retokenizes(tiny_tokenizer):
    corpus = [f"Human: what about item number {i}? Assistant: item {i} is great, really." for i in range(60)]
    rm_tokenizer = train_tokenizer(corpus, vocab_size=400)
    rm_model = reward_model(rm_tokenizer)
    rows = rollout_rows(tiny_tokenizer)
    in_process = RewardScorer(rm_model, tiny_tokenizer, own_tokenizer=rm_tokenizer)(*rows)
    served = TextRewardModel(rm_model, rm_tokenizer)(as_text(tiny_tokenizer, *rows))
    assert torch.allclose(torch.tensor(served), in_process, atol=1e-5)


def test_finished_appends_eos(tiny_tokenizer):
    scorer = TextRewardModel(reward_model(tiny_tokenizer), tiny_tokenizer)
    done, cut = scorer.encode(TextBatch(PROMPTS[:1] * 2, RESPONSES[:1] * 2, [True, False]))
    assert done == cut + [tiny_tokenizer.eos_token_id]


def test_long_rows_are_cut_as_in_training(tiny_tokenizer):
    rm_model = reward_model(tiny_tokenizer)
    scorer = TextRewardModel(rm_model, tiny_tokenizer, max_length=12, batch_size=2)
    batch = TextBatch(PROMPTS, RESPONSES, FINISHED)
    rows = scorer.encode(batch)
    assert all(len(r) <= 12 for r in rows)
    assert rows[0] == encode_prompt_response(tiny_tokenizer, PROMPTS[0], RESPONSES[0], 12, add_eos=True)[0]
    with torch.no_grad():
        one_by_one = [float(sequence_scores(rm_model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0])
                      for r in rows]
    assert scorer(batch) == pytest.approx(one_by_one, abs=1e-5)


def test_max_length_capped_at_the_model_context(tiny_tokenizer):
    assert TextRewardModel(reward_model(tiny_tokenizer, n_positions=64), tiny_tokenizer, max_length=1000
                           ).max_length == 64


def test_a_row_without_tokens_is_named(tiny_tokenizer):
    scorer = TextRewardModel(reward_model(tiny_tokenizer), tiny_tokenizer, name="reward model models:/rlhf-reward/1")
    with pytest.raises(RewardError, match="reward model models:/rlhf-reward/1: row 1: prompt and completion are both "
                       "empty"):
        scorer(TextBatch(["a", ""], ["b", ""], [True, False]))
