"""Multi-turn rollouts (docs/environments.md): an environment's tokens sit between the policy's turns, the models
read them, and nothing of PPO may count them: not the KL, not the score's position, not GAE, not the losses, not the
lengths. Hand-built two-turn rows with hand-computed figures, then the trainer on a scripted environment, where
garbage written on the environment's positions must change nothing."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from rlhf_lib.config import PPOConfig
from rlhf_lib.envs import ObservationFormat, Step
from rlhf_lib.ppo.advantages import compute_rewards, gae, group_advantages
from rlhf_lib.ppo.losses import policy_loss, value_loss
from rlhf_lib.ppo.metrics import response_stats
from rlhf_lib.ppo.trainer import PPOTrainer

from .tiny import PROMPTS, tiny_models

# One row, two policy turns: [p0 p1 | e0 e1 | p2] and a PAD. Garbage (99, NaN-free but huge) on e0, e1 and the PAD.
MASK = torch.tensor([[1, 1, 0, 0, 1, 0]])
G = 99.0


def test_gae_skips_the_environments_tokens_hand():
    # On the policy tokens alone the row is the 1x3 case of test_advantages: gamma 1, lambda 0.5,
    # r = [0, 0, 1], V = [0.5, 1.0, 1.5]:
    #   p2: delta = 1 - 1.5 = -0.5                    A = -0.5
    #   p1: delta = 0 + 1.5 - 1.0 = 0.5 (V of p2, the NEXT POLICY token, not of e0)   A = 0.5 + 0.5 * -0.5 = 0.25
    #   p0: delta = 0 + 1.0 - 0.5 = 0.5               A = 0.5 + 0.5 * 0.25 = 0.625
    rewards = torch.tensor([[0.0, 0.0, G, G, 1.0, G]])
    values = torch.tensor([[0.5, 1.0, G, -G, 1.5, G]])
    adv, ret = gae(rewards, values, MASK, gamma=1.0, lam=0.5)
    assert_close(adv, torch.tensor([[0.625, 0.25, 0.0, 0.0, -0.5, 0.0]]))
    assert_close(ret, torch.tensor([[1.125, 1.25, 0.0, 0.0, 1.0, 0.0]]))
    # The environment's values and rewards are never read: other garbage, the same result.
    adv2, ret2 = gae(rewards.clone().fill_(-7.0).masked_scatter(MASK.bool(), torch.tensor([0.0, 0.0, 1.0])),
                     values.clone().fill_(3.0).masked_scatter(MASK.bool(), torch.tensor([0.5, 1.0, 1.5])), MASK, 1.0,
                     0.5)
    assert_close(adv2, adv)
    assert_close(ret2, ret)


def test_kl_and_score_count_the_policys_tokens_only_hand():
    # log pi - log pi_ref: p0 0.2, p1 -0.4, p2 0.6; e0, e1 and the PAD differ by 2G but are not the policy's.
    logprobs = torch.tensor([[0.2, -0.4, G, G, 0.6, G]])
    ref = torch.tensor([[0.0, 0.0, -G, -G, 0.0, -G]])
    rewards, stats = compute_rewards(torch.tensor([2.0]), logprobs, ref, MASK, kl_coef=0.5)
    # -0.5 * [0.2, -0.4, -, -, 0.6] = [-0.1, 0.2, 0, 0, -0.3]; the score 2 on p2 (index 4, the last policy token,
    # not the PAD after it nor the environment's e1).
    assert_close(rewards, torch.tensor([[-0.1, 0.2, 0.0, 0.0, 1.7, 0.0]]))
    assert stats["non_score_reward"] == pytest.approx(-0.2)


def test_group_advantages_sum_the_policys_tokens_only_hand():
    # Two rows of one group (k = 2). Row 0: the two-turn row, per-token rewards [1, 0, G, G, 2, G] -> R = 3.
    # Row 1: one turn, [1, 0, 0, 0, 0, 0] with mask [1, 0, ...] -> R = 1. rloo: A = R_i - R_j = +2 / -2.
    rewards = torch.tensor([[1.0, 0.0, G, G, 2.0, G], [1.0, G, G, G, G, G]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]])
    adv = group_advantages(rewards, mask, 2, "rloo")
    assert_close(adv, torch.tensor([[2.0, 2.0, 0.0, 0.0, 2.0, 0.0], [-2.0, 0, 0, 0, 0, 0]]))


def test_losses_never_read_the_environments_tokens():
    logprobs = torch.tensor([[0.0, 0.0, 5.0, -5.0, 0.0, 3.0]], requires_grad=True)
    old = torch.zeros(1, 6)
    adv = torch.tensor([[1.0, -1.0, G, G, 1.0, G]])
    loss, stats = policy_loss(logprobs, old, adv, MASK, clip_eps=0.2)
    # ratio 1 on the three policy tokens: loss = -(1 - 1 + 1) / 3
    assert_close(loss, torch.tensor(-1 / 3))
    assert stats["clipfrac"] == 0.0
    loss.backward()
    assert (logprobs.grad[~MASK.bool()] == 0).all()
    v, v_old, ret = torch.tensor([[1.0, 1.0, G, G, 1.0, G]]), torch.ones(1, 6), torch.tensor([[2.0, 1.0, G, G, 1.0, G]])
    vloss, _ = value_loss(v, v_old, ret, MASK, clip_range=0.2)
    # 0.5 * mean of squared errors over the policy tokens: 0.5 * (1 + 0 + 0) / 3
    assert_close(vloss, torch.tensor(0.5 / 3))


class ScriptedEnv:
    """Answers the first turn with "topic 3" (reward 0.5) and ends the episode at the second (reward 1)."""

    def reset(self, row: Mapping[str, Any]) -> None:
        self.turn = 0

    def step(self, message: str) -> Step:
        self.turn += 1
        if self.turn == 1:
            return Step("topic 3", 0.5)
        return Step(None, 1.0, done=True)


ENV = f"{__name__}:ScriptedEnv"
CFG = PPOConfig(iterations=2, batch_size=4, minibatches=2, epochs=2, max_new_tokens=4, lr=1e-3, environment=ENV,
                max_turns=2, max_episode_tokens=32, rm_offset_samples=0,
                rewards=[{"name": "env", "kind": "environment"}, {"name": "rm", "kind": "model", "weight": 0.1}])


def _trainer(tokenizer) -> PPOTrainer:
    torch.manual_seed(0)
    return PPOTrainer(tiny_models(tokenizer), PROMPTS[:4], CFG, max_prompt_tokens=32)


def test_a_rollout_interleaves_the_turns_and_masks_the_environments_tokens(tiny_tokenizer):
    trainer = _trainer(tiny_tokenizer)
    ro = trainer.rollout()
    obs = ObservationFormat(tiny_tokenizer, transcript=True).ids("topic 3")
    for i in range(ro.batch_size):
        seen, act = ro.response_mask[i].bool(), ro.action_mask[i].bool()
        env_positions = (seen & ~act).nonzero().flatten()
        # The environment's tokens are the observation, in one block after the first turn's last token.
        assert ro.response[i, env_positions].tolist() == obs
        first = int(env_positions[0])
        assert act[:first].all() and act[first + len(obs): int(seen.sum())].all()
        assert ro.logprobs[i, env_positions].eq(0).all()
        assert [t.role for t in ro.turns[i]] == ["policy", "environment", "policy"]
    assert ro.env_returns.tolist() == [1.5] * 4
    trainer.score(ro)
    assert_close(ro.score_parts["env"], torch.full((4,), 1.5))
    trainer.advantages(ro)
    env = (ro.response_mask.bool() & ~ro.action_mask.bool())
    for name in ("rewards", "advantages", "returns"):
        assert getattr(ro, name)[env].eq(0).all(), name
    stats = response_stats(ro, tiny_tokenizer.eos_token_id)
    assert stats["response/length_mean"] == pytest.approx(float(ro.action_mask.sum(1).float().mean()))
    assert stats["env/tokens_mean"] == pytest.approx(len(obs)) and stats["env/turns_mean"] == 2.0


def test_garbage_on_the_environments_tokens_changes_neither_advantages_nor_the_update(tiny_tokenizer):
    """Two identical trainers; one rollout, and a copy of it with garbage on every environment position of every
    per-token field the later phases read. Advantages, the update's statistics and the new weights must agree."""
    a, b = _trainer(tiny_tokenizer), _trainer(tiny_tokenizer)
    ro = a.rollout()
    a.score(ro)
    bad = copy.deepcopy(ro)
    env = (ro.response_mask.bool() & ~ro.action_mask.bool())
    for name in ("logprobs", "ref_logprobs", "values"):
        getattr(bad, name)[env] = 37.0
    a.advantages(ro)
    b.advantages(bad)
    for name in ("rewards", "advantages", "returns"):
        assert_close(getattr(bad, name), getattr(ro, name))
    bad.advantages[env], bad.returns[env] = -50.0, 50.0
    b.generator.set_state(a.generator.get_state())  # the same minibatch draws (a's sampled the rollout)
    sa, sb = a.update(ro), b.update(bad)
    for key in ("loss/policy", "loss/value", "policy/clipfrac", "policy/entropy"):
        if key in sa:
            assert sb[key] == pytest.approx(sa[key], rel=1e-5, abs=1e-7), key
    for (name, pa), pb in zip(a.models.policy.named_parameters(), b.models.policy.parameters()):
        assert_close(pb, pa, msg=name)


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_critic_free_estimators_run_on_episodes(tiny_tokenizer, estimator):
    cfg = CFG.model_copy(update={"advantage_estimator": estimator, "group_size": 2})
    torch.manual_seed(0)
    models = tiny_models(tiny_tokenizer)
    models.value = None
    trainer = PPOTrainer(models, PROMPTS[:4], cfg, max_prompt_tokens=32)
    ro, stats = trainer.step()
    env = ro.response_mask.bool() & ~ro.action_mask.bool()
    assert env.any() and ro.advantages[env].eq(0).all() and ro.values is None
    # Each group answers one prompt; each row's advantage is one number over its policy tokens.
    assert ro.prompts[0] == ro.prompts[1] and ro.prompts[2] == ro.prompts[3]
    for i in range(ro.batch_size):
        assert ro.advantages[i][ro.action_mask[i].bool()].unique().numel() == 1
    assert stats["env/turns_mean"] == 2.0 and stats["env/return_mean"] == 1.5
