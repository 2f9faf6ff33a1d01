from __future__ import annotations

import copy
import math

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.sampler import PromptSampler
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(8)]
CFG = PPOConfig(iterations=2, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3)


def _trainer(policy, cfg=CFG):
    torch.manual_seed(0)
    rm = build_scalar_model(policy, seed=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    models = PPOModels(policy=policy, ref=copy.deepcopy(policy), reward=rm, value=copy.deepcopy(rm),
                       tokenizer=None)
    return models


def _make(tiny_tokenizer, tiny_policy, cfg=CFG, precision="no"):
    m = _trainer(tiny_policy, cfg)
    m.tokenizer = tiny_tokenizer
    return PPOTrainer(m, PROMPTS, cfg, max_prompt_tokens=32, mixed_precision=precision)


# The trainer's behaviour in float32 and under bf16 autocast (`resources.mixed_precision`).
PRECISIONS = pytest.mark.parametrize("precision", ["no", "bf16"])


@PRECISIONS
def test_one_iteration_fills_the_rollout_and_logs_finite_metrics(tiny_tokenizer, tiny_policy, precision):
    trainer = _make(tiny_tokenizer, tiny_policy, CFG, precision)
    ro, stats = trainer.step()
    for name in ("ref_logprobs", "values", "scores", "rewards", "advantages", "returns"):
        assert getattr(ro, name) is not None
    assert all(math.isfinite(v) for v in stats.values()), stats
    # The reference is the untouched starting policy: before any update the KL of its samples is ~0.
    assert abs(stats["objective/kl"]) < 1e-4
    assert 0 <= stats["policy/clipfrac"] <= 1


@PRECISIONS
def test_policy_and_value_move_reference_and_reward_do_not(tiny_tokenizer, tiny_policy, precision):
    trainer = _make(tiny_tokenizer, tiny_policy, CFG, precision)
    before = {k: copy.deepcopy(getattr(trainer.models, k).state_dict()) for k in ("policy", "ref", "reward", "value")}
    trainer.step()
    changed = {k: any(not torch.equal(v, getattr(trainer.models, k).state_dict()[n]) for n, v in before[k].items())
               for k in before}
    assert changed == {"policy": True, "ref": False, "reward": False, "value": True}


def test_same_seed_same_metrics(tiny_tokenizer):
    from rlhf_lib.models import build_policy

    runs = []
    for _ in range(2):
        policy = build_policy(tiny_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0)
        trainer = _make(tiny_tokenizer, policy)
        stats = [trainer.step()[1] for _ in range(2)]
        runs.append([{k: v for k, v in s.items() if not k.startswith("time/")} for s in stats])
    assert runs[0] == runs[1]


def test_first_minibatch_ratio_is_one(tiny_tokenizer, tiny_policy):
    # Rollout log-probs come from the sampling step; the update's forward must reproduce them exactly enough
    # that the very first ratio is 1 (no clipping, approx KL ~ 0).
    cfg = CFG.model_copy(update={"epochs": 1, "minibatches": 1})
    trainer = _make(tiny_tokenizer, tiny_policy, cfg)
    _, stats = trainer.step()
    assert abs(stats["policy/ratio_mean"] - 1) < 1e-5
    assert stats["policy/clipfrac"] == 0


def test_adaptive_kl_moves_beta(tiny_tokenizer, tiny_policy):
    trainer = _make(tiny_tokenizer, tiny_policy, CFG.model_copy(update={"target_kl": 1.0}))
    trainer.step()
    # KL ~ 0 < target -> error clipped to -0.2 -> beta *= 1 - 0.2 * 8 / 10000
    assert math.isclose(trainer.kl_ctl.value, 0.05 * (1 - 0.2 * 8 / 10000), rel_tol=1e-9)


def test_prompt_sampler_covers_every_prompt_each_pass():
    s = PromptSampler(["a", "b", "c"], seed=0)
    first, second = s.next(3), s.next(3)
    assert sorted(first) == sorted(second) == ["a", "b", "c"]


@PRECISIONS
def test_nan_reward_refuses_the_update_and_repeated_nans_stop_the_run(tiny_tokenizer, tiny_policy, precision):
    trainer = _make(tiny_tokenizer, tiny_policy, CFG.model_copy(update={"max_refused_iterations": 2}),
                    precision=precision)
    before = copy.deepcopy(trainer.models.policy.state_dict())
    real_score = trainer.score

    def nan_score(ro):
        real_score(ro)
        ro.raw_scores = ro.raw_scores * float("nan")  # a broken reward model

    trainer.score = nan_score
    _, stats = trainer.step()
    assert stats["update/refused_steps"] == CFG.epochs * CFG.minibatches
    assert math.isnan(stats["loss/policy"])
    assert all(torch.equal(v, trainer.models.policy.state_dict()[k]) for k, v in before.items())
    with pytest.raises(FloatingPointError, match="2 iterations in a row"):
        trainer.step()


@PRECISIONS
def test_one_good_iteration_resets_the_refusal_count(tiny_tokenizer, tiny_policy, precision):
    trainer = _make(tiny_tokenizer, tiny_policy, CFG.model_copy(update={"max_refused_iterations": 2}),
                    precision=precision)
    trainer._guard(CFG.epochs * CFG.minibatches)
    trainer._guard(0)
    trainer._guard(CFG.epochs * CFG.minibatches)  # 1 in a row again: no error
    assert trainer.refused_streak == 1


@PRECISIONS
def test_rm_offset_centres_sft_scores_and_shifts_a_value_model_copied_from_the_rm(tiny_tokenizer, tiny_policy,
                                                                                   precision):
    cfg = CFG.model_copy(update={"rm_offset_samples": 64, "batch_size": 64, "minibatches": 4})
    trainer = _make(tiny_tokenizer, tiny_policy, cfg, precision=precision)
    ro = trainer.rollout()
    trainer.score(ro)
    trainer.advantages(ro)
    assert trainer.rm_offset != 0.0
    assert trainer.critic.offset == trainer.rm_offset
    # The policy is still SFT: its shaped scores average ~0 (64 fresh samples vs the offset's 64).
    assert abs(float(ro.scores.mean())) < 0.5 * float(ro.raw_scores.abs().mean())
    torch.testing.assert_close(ro.scores, ro.raw_scores - trainer.rm_offset)


def test_rm_unit_std_divides_by_the_sft_samples_score_spread(tiny_tokenizer, tiny_policy):
    cfg = CFG.model_copy(update={"rm_offset_samples": 16, "rm_unit_std": True})
    trainer = _make(tiny_tokenizer, tiny_policy, cfg)
    seen, score = [], trainer.rewards
    trainer.rewards = lambda *a, **k: seen.append(score(*a, **k).total) or score(*a, **k)  # a spy: calls through
    mean, std = trainer._rm_offset()
    raw = torch.cat(seen).double()  # the 16 SFT samples' scores, in two batches of 8
    assert raw.shape == (16,) and mean == pytest.approx(float(raw.mean()))
    assert std == pytest.approx(float(raw.std(unbiased=False))) and std != 1.0
    trainer.rewards = score
    assert trainer._rm_offset() == (mean, std)  # its own RNGs: the same samples every time
    ro = trainer.rollout()
    trainer.score(ro)
    trainer.advantages(ro)
    assert (trainer.rm_offset, trainer.rm_scale) == (mean, std)
    torch.testing.assert_close(ro.scores, ((ro.raw_scores.double() - mean) / std).float())
    state = trainer.extra_state()
    assert state["rm_scale"] == std
    trainer.load_extra_state(state | {"rm_scale": 3.0})
    assert trainer.rm_scale == 3.0
    del state["rm_scale"]  # a checkpoint from before rm_unit_std
    trainer.load_extra_state(state)
    assert trainer.rm_scale == 1.0
    off = _make(tiny_tokenizer, tiny_policy, cfg.model_copy(update={"rm_unit_std": False}))
    assert off._rm_offset() == (pytest.approx(mean), 1.0)
    with pytest.raises(ValueError, match="rm_unit_std needs ppo.rm_offset_samples"):
        PPOConfig.model_validate(CFG.model_dump() | {"rm_offset_samples": 0, "rm_unit_std": True})


def test_scoring_in_row_chunks_gives_the_one_pass_results(tiny_tokenizer, tiny_policy):
    """Chunks of 3 rows (uneven: 3 + 3 + 2) against all 8 at once, on one rollout with padded prompts."""
    prompts = [p + " please" * (i % 3) for i, p in enumerate(PROMPTS)]
    for estimator in ("gae", "rloo"):
        cfg = CFG.model_copy(update={"advantage_estimator": estimator, "group_size": 2, "rm_offset_samples": 0})
        trainer = PPOTrainer(_trainer(tiny_policy, cfg), prompts, cfg, max_prompt_tokens=32)
        trainer.models.tokenizer = tiny_tokenizer
        ro = trainer.rollout()
        assert not bool(ro.query_mask.all())  # some prompts are left-padded
        out = {}
        for rows in (8, 3):
            trainer.cfg = cfg.model_copy(update={"score_batch_size": rows})
            trainer.score(ro)
            out[rows] = (ro.ref_logprobs, ro.values, ro.raw_scores)
        torch.testing.assert_close(out[3][0], out[8][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out[3][2], out[8][2], rtol=1e-5, atol=1e-6)
        if estimator == "gae":
            torch.testing.assert_close(out[3][1], out[8][1], rtol=1e-5, atol=1e-6)
        else:
            assert out[3][1] is None and out[8][1] is None


@PRECISIONS
def test_critic_free_rollouts_repeat_each_prompt_group_size_times(tiny_tokenizer, tiny_policy, precision):
    cfg = CFG.model_copy(update={"advantage_estimator": "grpo", "group_size": 4, "rm_offset_samples": 0})
    trainer = _make(tiny_tokenizer, tiny_policy, cfg, precision=precision)
    assert trainer.critic.kind == "none" and len(trainer.optimizer.param_groups) == 1
    ro, stats = trainer.step()
    assert ro.prompts[:4] == [ro.prompts[0]] * 4 and ro.prompts[4:] == [ro.prompts[4]] * 4
    assert ro.values is None and "value/explained_variance" not in stats
    assert all(math.isfinite(v) for v in stats.values()), stats


class _StandInEngine:
    """The rollout-engine interface the trainer uses (generate, sync_weights, close), on its own copy of the policy:
    a stand-in for vLLM, which needs a GPU. Its log-probs are deliberately wrong, as an engine's can be."""

    def __init__(self, policy, tokenizer):
        from rlhf_lib.lm.generation import sample

        self.copy, self.tok, self.sample, self.synced = copy.deepcopy(policy), tokenizer, sample, 0

    def generate(self, query, query_mask):
        r, m, lp = self.sample(self.copy, query, query_mask, max_new_tokens=6, temperature=1.0,
                               eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id,
                               generator=torch.Generator().manual_seed(3))
        return r, m, lp + 5.0

    def sync_weights(self, policy):
        self.copy.load_state_dict(policy.state_dict())
        self.synced += 1


def test_an_engine_samples_the_policy_recomputes_the_logprobs_and_weights_follow_each_update(tiny_tokenizer,
                                                                                              tiny_policy):
    from rlhf_lib.lm.scoring import response_logprobs

    trainer = _make(tiny_tokenizer, tiny_policy)
    trainer.engine = engine = _StandInEngine(tiny_policy, tiny_tokenizer)
    ro = trainer.rollout()
    expected, _ = response_logprobs(trainer.models.policy, ro.query.clone(), ro.query_mask.clone(), ro.response.clone(),
                                    ro.response_mask.clone(), temperature=CFG.temperature)
    torch.testing.assert_close(ro.logprobs, expected)  # the policy's, not the engine's (+5)
    trainer.step()
    assert engine.synced >= 1
    for a, b in zip(engine.copy.parameters(), trainer.models.policy.parameters(), strict=True):
        assert torch.equal(a, b)  # the engine samples from the updated policy


@pytest.mark.parametrize("control", ["zero_reward", "shuffled_reward"])
def test_a_control_arm_trains_on_the_controlled_score_and_logs_the_real_one(tiny_tokenizer, tiny_policy, control):
    """ppo.reward_control: the RM still scores every reply (its raw score is the dashboard's `objective/score_raw`),
    but the score on the last token is 0 plus the missing-EOS penalty (zero_reward), or the normalised scores in
    the seeded permuted order (shuffled_reward)."""
    from rlhf_lib.lm.generation import ends_with_eos
    from rlhf_lib.ppo.shaping import control_seed

    cfg = CFG.model_copy(update={"reward_control": control, "missing_eos_penalty": 0.5})
    trainer = _make(tiny_tokenizer, tiny_policy, cfg)
    ro, stats = trainer.step()
    has_eos = ends_with_eos(ro.response, ro.response_mask, tiny_tokenizer.eos_token_id)
    penalty = torch.where(has_eos, 0.0, -0.5)
    normalised = ro.raw_scores - trainer.rm_offset
    if control == "zero_reward":
        expected = penalty
    else:
        perm = torch.randperm(len(normalised), generator=torch.Generator().manual_seed(control_seed(CFG.seed, 0)))
        expected = normalised[perm] + penalty
    assert torch.allclose(ro.scores, expected, atol=1e-6)
    assert stats["objective/score_raw"] == pytest.approx(float(ro.raw_scores.mean()))
    assert float(ro.raw_scores.std()) > 0  # the RM did score the replies
