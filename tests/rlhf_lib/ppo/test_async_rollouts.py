"""One-step-off-policy rollouts (ppo.async_rollouts): the truncated importance weights by hand, the weighted
surrogate and its gradient by hand, which weights sample which rollout, the synchronous loop untouched at
staleness 0, and the rollout task submitted before the update task in the Prefect sub-flow. Resume exactness is in
test_checkpoint.py (the async1 and async2_lora variants)."""

from __future__ import annotations

import copy
import math
import time

import pytest
import torch

from rlhf_lib.config import PipelineConfig, PPOConfig
from rlhf_lib.config.async_rollouts import AsyncRolloutsConfig
from rlhf_lib.ppo.alarms import AlarmMonitor
from rlhf_lib.ppo.async_rollouts import rollout_seed
from rlhf_lib.ppo.losses import policy_loss, truncated_is_weights
from tests.rlhf_lib.ppo.tiny import tiny_trainer

CFG = PPOConfig(batch_size=4, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-2, iterations=4, rm_offset_samples=0)


def _async(staleness: int, **kw) -> PPOConfig:
    return CFG.model_copy(update=dict(async_rollouts=AsyncRolloutsConfig(staleness=staleness, **kw)))


def test_truncated_is_weights_by_hand():
    # pi_old / mu per token: 0.5 / 0.25 = 2 (truncated to the cap 1.5), 0.2 / 0.4 = 0.5; the third token is padding.
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    mu = torch.log(torch.tensor([[0.25, 0.4, 1e-9]]))
    mask = torch.tensor([[1, 1, 0]])
    w, stats = truncated_is_weights(old, mu, mask, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0]]))
    assert stats["is_weight_mean"] == pytest.approx(1.25)  # before truncation: (2 + 0.5) / 2
    assert stats["is_weight_max"] == pytest.approx(2.0)
    assert stats["is_truncated_frac"] == pytest.approx(0.5)


def test_weighted_surrogate_and_its_gradient_by_hand():
    # ratio 1 (the policy is pi_old), advantages +1 and -1: per-token losses -1 and +1; weights 2 and 0.5:
    # L = (2 * -1 + 0.5 * 1) / 2 = -0.75, dL/dlogp_t = -w_t A_t rho_t / 2 = (-1, +0.25).
    logp = torch.log(torch.tensor([[0.3, 0.6]])).requires_grad_(True)
    adv, mask, w = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), torch.tensor([[2.0, 0.5]])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, clip_eps=0.2, is_weights=w)
    loss.backward()
    assert loss.item() == pytest.approx(-0.75)
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.25]]))
    unweighted, _ = policy_loss(logp, logp.detach(), adv, mask, clip_eps=0.2)
    assert unweighted.item() == pytest.approx(0.0)  # (-1 + 1) / 2: the weights are what moved it
    assert policy_loss(logp, logp.detach(), adv, mask, 0.2, torch.ones(1, 2))[0].item() == pytest.approx(0.0)


@pytest.mark.parametrize("staleness", [1, 2])
def test_each_rollout_is_sampled_by_the_weights_of_staleness_updates_ago(tiny_tokenizer, staleness):
    trainer = tiny_trainer(tiny_tokenizer, _async(staleness))
    weights = [copy.deepcopy(trainer.models.policy.state_dict())]  # weights[k]: after k updates
    for it in range(4):
        ro, stats = trainer.step()
        version = max(0, it - staleness)
        assert ro.version == version and stats["async/staleness"] == it - version
        # The behaviour log-probs are those of the weights of `version` updates (recomputed here by a full forward,
        # the sampler's are incremental: float32 agreement), the old log-probs those of the weights before this update.
        judge = copy.deepcopy(trainer.models.policy)
        judge.load_state_dict(weights[version])
        mu = _logprobs(judge, ro)
        judge.load_state_dict(weights[it])
        assert torch.allclose(ro.behaviour_logprobs, mu, atol=1e-5)
        assert torch.allclose(ro.logprobs, _logprobs(judge, ro), atol=1e-5)
        if version < it:  # the policy moved since it sampled: weights other than 1, the surrogate corrected
            assert not torch.allclose(ro.is_weights[ro.response_mask.bool()], torch.ones(()))
        assert set(stats) >= {"async/is_weight_mean", "async/is_weight_max", "async/is_truncated_frac",
                              "time/rollout_wait_s", "time/overlap_s", "time/rollout_s"}
        weights.append(copy.deepcopy(trainer.models.policy.state_dict()))
    assert not trainer.queue.pending  # the last `staleness` iterations submit nothing beyond `ppo.iterations`
    trainer.close()


def _logprobs(model, ro) -> torch.Tensor:
    from rlhf_lib.lm.scoring import response_logprobs

    with torch.inference_mode():
        return response_logprobs(model, ro.query, ro.query_mask, ro.response, ro.response_mask,
                                 temperature=CFG.temperature)[0] * ro.response_mask


def test_rollouts_depend_on_seed_and_index_not_on_timing(tiny_tokenizer):
    a, b = tiny_trainer(tiny_tokenizer, _async(1)), tiny_trainer(tiny_tokenizer, _async(1))
    ra = [a.step()[0] for _ in range(3)]
    for _ in range(3):  # b's sampler finishes each rollout before the trainer asks: a different interleaving
        for item in list(b.queue.pending.values()):
            item.result()
        rb = b.step()[0]
        assert torch.equal(rb.response, ra[b.iteration - 1].response)
    assert rollout_seed(0, 1) != rollout_seed(0, 2) != rollout_seed(1, 1)


def test_staleness_0_is_the_synchronous_loop_and_keeps_its_cache_key(tiny_tokenizer):
    assert tiny_trainer(tiny_tokenizer, CFG).queue is None
    assert "async_rollouts" not in CFG.key()
    assert PPOConfig.model_validate({"async_rollouts": {"staleness": 0}}).key() == PPOConfig().key()
    assert PPOConfig.model_validate({"async_rollouts": {"staleness": 1}}).key()["async_rollouts"]["staleness"] == 1


@pytest.mark.parametrize("bad, message", [
    ({"rollout_engine": "vllm"}, None),  # refused without vLLM before the async check; with it, by the async check
    ({"environment": "calculator", "rewards": [{"name": "env", "kind": "environment"}]}, "multi-turn"),
    ({"async_rollouts": {"staleness": 3}}, "staleness"),
    ({"async_rollouts": {"staleness": 1, "is_cap": 0.5}}, "is_cap"),
])
def test_async_rollouts_refuse_what_they_cannot_run(bad, message):
    with pytest.raises(ValueError, match=message):
        PipelineConfig.model_validate({"ppo": {"async_rollouts": {"staleness": 1}, **bad}})


def test_the_is_blowup_alarm_fires_on_a_large_truncated_share():
    cfg = _async(1, alarm_truncated_frac=0.1)
    monitor = AlarmMonitor(cfg)
    assert not [a for a in monitor.check(0, {"async/is_truncated_frac": 0.05}) if a.name == "is_blowup"]
    fired = [a for a in monitor.check(1, {"async/is_truncated_frac": 0.2, "async/is_weight_max": 9.0})
             if a.name == "is_blowup"]
    assert len(fired) == 1 and "20%" in fired[0].message and math.isfinite(9.0)


def test_the_prefect_subflow_submits_the_next_rollout_before_the_update(tmp_path, tiny_tokenizer, tiny_policy,
                                                                       prefect_server):
    """In the PPO stage's sub-flow (`stages.ppo.as_task`), rollout t + 1 is a task run that starts before update t
    ends; synchronously it starts after."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from rlhf_lib.events import Recorder
    from rlhf_lib.model_dirs import save_model
    from rlhf_lib.models import build_scalar_model
    from rlhf_lib.ppo.loop import PPOJob, train_ppo
    from stages.ppo import as_task
    from tests.rlhf_lib.ppo.tiny import PROMPTS

    save_model(tiny_policy, tiny_tokenizer, tmp_path / "sft")
    save_model(build_scalar_model(tiny_policy, seed=1), tiny_tokenizer, tmp_path / "rm")

    def run(staleness: int) -> list:
        cfg = PipelineConfig.model_validate({"model": {"n_positions": 64}, "ppo": {
            "iterations": 3, "batch_size": 4, "minibatches": 2, "epochs": 1, "max_new_tokens": 6,
            "rm_offset_samples": 0, "async_rollouts": {"staleness": staleness}}})
        job = PPOJob(config=cfg.model_dump(mode="json"), sft_dir=str(tmp_path / "sft"),
                     reward_dir=str(tmp_path / "rm"), prompts=PROMPTS, out_dir=str(tmp_path / f"out{staleness}"))

        @flow(name=f"ppo-async-{staleness}")
        def ppo_flow():
            train_ppo(job, Recorder(), tmp_path / f"work{staleness}", call=as_task)

        state = ppo_flow(return_state=True)
        # Prefect 3 reports task runs to the server through events: wait until all 12 are recorded as finished.
        deadline = time.monotonic() + 60
        while True:
            with get_client(sync_client=True) as client:
                runs = [r for r in client.read_task_runs() if r.flow_run_id == state.state_details.flow_run_id]
            done = [r for r in runs if r.start_time is not None and r.end_time is not None]
            if len(done) >= 12 or time.monotonic() > deadline:
                return sorted(done, key=lambda r: r.start_time)
            time.sleep(0.5)

    for staleness in (0, 1):
        runs = run(staleness)
        rollouts = [r for r in runs if r.name.startswith("rollout")]
        updates = [r for r in runs if r.name.startswith("update")]
        assert len(rollouts) == len(updates) == 3
        for t in range(2):
            before = rollouts[t + 1].start_time < updates[t].end_time
            assert before == bool(staleness), (staleness, t)
