"""PPO with reward sources besides the RM (`ppo.rewards`): the weighted sum, the parts in the metrics, no RM at all,
and a failing source that leaves the trainer as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.config.rewards import RewardSource
from rlhf_lib.lm.generation import decode_responses
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from rlhf_lib.rewards.base import RewardError
from rlhf_lib.rewards.combine import RewardSet
from tests.rlhf_lib.rewards import sample_rewards

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(8)]
MOD = "tests.rlhf_lib.rewards.sample_rewards"
LETTERS = {"name": "letters", "kind": "function", "function": f"{MOD}:count_letters"}


def _cfg(*rewards, **kw):
    base = dict(iterations=2, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3, rm_offset_samples=0)
    return PPOConfig(rewards=list(rewards), **(base | kw))


def _trainer(tokenizer, policy, cfg, with_rm=False, columns=None):
    torch.manual_seed(0)
    rm = build_scalar_model(policy, seed=1) if with_rm else None
    models = PPOModels(policy=policy, ref=copy.deepcopy(policy), reward=rm, value=build_scalar_model(policy, seed=2),
                       tokenizer=tokenizer)
    return PPOTrainer(models, PROMPTS, cfg, max_prompt_tokens=32, columns=columns)


class FixedRM:
    """An RM scorer returning 10 x the row index, to check the sum by hand."""

    def __call__(self, query, query_mask, response, response_mask):
        return torch.arange(query.shape[0], dtype=torch.float32) * 10


def test_the_score_is_the_weighted_sum_by_hand(tiny_tokenizer):
    sources = [RewardSource(name="rm", kind="model", weight=0.5),
               RewardSource(name="one", kind="function", function=f"{MOD}:constant", params={"value": 2.0},
                            weight=-1.0)]
    rewards = RewardSet(sources, FixedRM(), tiny_tokenizer, batch_size=2)
    q, qm = torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2, dtype=torch.long)
    r, rm = torch.full((3, 2), 5), torch.ones(3, 2, dtype=torch.long)
    got = rewards(["a", "b", "c"], q, qm, r, rm)
    # rm parts: 0, 10, 0 (chunks of 2 rows restart the index); sum = 0.5 * rm - 1.0 * 2
    assert got.parts["rm"].tolist() == [0.0, 10.0, 0.0]
    assert got.parts["one"].tolist() == [2.0, 2.0, 2.0]
    assert got.total.tolist() == [-2.0, 3.0, -2.0]


def test_a_model_source_without_a_model_is_refused(tiny_tokenizer):
    with pytest.raises(ValueError, match="no reward model was loaded"):
        RewardSet([RewardSource(name="rm", kind="model")], None, tiny_tokenizer)


def test_ppo_without_a_reward_model_scores_with_the_function(tiny_tokenizer, tiny_policy):
    sample_rewards.CALLS.clear()
    columns = {p: {"answer": str(i)} for i, p in enumerate(PROMPTS)}
    trainer = _trainer(tiny_tokenizer, tiny_policy, _cfg(RewardSource(**LETTERS, weight=0.5)), columns=columns)
    ro, stats = trainer.step()
    texts = decode_responses(tiny_tokenizer, ro.response, ro.response_mask)
    assert ro.raw_scores.tolist() == [0.5 * len(t) for t in texts]
    assert stats["objective/score/letters"] == pytest.approx(sum(map(len, texts)) / len(texts))
    assert stats["objective/score/letters_weighted"] == pytest.approx(0.5 * stats["objective/score/letters"])
    # The function saw each row's prompt, completion and the prompt's own answer column.
    call = sample_rewards.CALLS[0]
    assert call["prompts"] == ro.prompts and call["completions"] == texts
    assert call["answer"] == [columns[p]["answer"] for p in ro.prompts]
    assert trainer.models.reward is None and trainer.critic.kind == "separate"


def test_the_rm_offset_applies_to_the_sum(tiny_tokenizer, tiny_policy):
    const = RewardSource(name="c", kind="function", function=f"{MOD}:constant", params={"value": 3.0}, weight=0.5)
    trainer = _trainer(tiny_tokenizer, tiny_policy, _cfg(const, rm_offset_samples=8))
    ro, stats = trainer.step()
    assert trainer.rm_offset == pytest.approx(1.5)
    assert ro.scores.abs().max() < 1e-6  # 0.5 x 3 - 1.5
    assert stats["objective/score_raw"] == pytest.approx(1.5)


def test_rm_and_function_both_in_the_metrics(tiny_tokenizer, tiny_policy):
    cfg = _cfg(RewardSource(name="rm", kind="model"), RewardSource(**LETTERS, weight=0.1))
    trainer = _trainer(tiny_tokenizer, tiny_policy, cfg, with_rm=True)
    ro, stats = trainer.step()
    assert set(ro.score_parts) == {"rm", "letters"}
    expected = ro.score_parts["rm"] + 0.1 * ro.score_parts["letters"]
    assert torch.allclose(ro.raw_scores, expected)
    for key in ("objective/score/rm", "objective/score/rm_weighted", "objective/score/letters_weighted"):
        assert key in stats


def test_each_source_reports_its_seconds(tiny_tokenizer, tiny_policy):
    slow = RewardSource(name="slow", kind="function", function=f"{MOD}:slow", params={"seconds": 0.2}, weight=0.0)
    trainer = _trainer(tiny_tokenizer, tiny_policy, _cfg(RewardSource(name="rm", kind="model"), slow), with_rm=True)
    _, stats = trainer.step()
    assert stats["time/score/slow_s"] >= 0.2 and 0.0 <= stats["time/score/rm_s"] <= stats["time/score_s"]
    assert stats["time/score/slow_s"] <= stats["time/score_s"]


@pytest.mark.parametrize("name", ["too_few", "not_finite", "raises"])
def test_a_failing_source_leaves_the_trainer_as_it_was(tiny_tokenizer, tiny_policy, name):
    bad = RewardSource(name="bad", kind="function", function=f"{MOD}:{name}")
    trainer = _trainer(tiny_tokenizer, tiny_policy, _cfg(bad))
    weights = copy.deepcopy(trainer.models.policy.state_dict())
    kl = trainer.kl_ctl.value
    with pytest.raises(RewardError, match="reward 'bad'"):
        trainer.step()
    assert trainer.iteration == 0 and trainer.kl_ctl.value == kl
    assert not trainer.optimizer.state  # no Adam step was taken
    assert all(torch.equal(v, trainer.models.policy.state_dict()[k]) for k, v in weights.items())
