"""Evaluation during PPO (`ppo.eval_every`) and `ppo.keep: best`: when the held-out figures are logged, which policy
is kept, and that the best survives a checkpoint."""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.events import Metrics, Recorder, Tags
from rlhf_lib.ppo.checkpoint import load_checkpoint, save_checkpoint
from rlhf_lib.ppo.heldout import BestPolicy, consider, heldout_stats
from rlhf_lib.ppo.loop import kept_policy, ppo_loop
from rlhf_lib.ppo.trainer import PPOTrainer
from tests.rlhf_lib.ppo.tiny import tiny_trainer

HELDOUT = [f"\n\nHuman: topic {i} please\n\nAssistant:" for i in range(4)]
CFG = PPOConfig(iterations=4, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3, eval_every=2,
                keep="best", checkpoint_every=100)


def judge(prompt: str, response: str) -> float:
    """A judge that likes short answers: its best iteration is where the policy answered shortest."""
    return -float(len(response))


def _trainer(tokenizer, cfg: PPOConfig = CFG) -> PPOTrainer:
    return tiny_trainer(tokenizer, cfg)


def test_heldout_figures_are_logged_every_n_iterations_and_after_the_last(tiny_tokenizer, tmp_path):
    trainer, sink = _trainer(tiny_tokenizer, CFG.model_copy(update={"iterations": 3})), Recorder()
    ppo_loop(trainer, sink, 3, tmp_path, judge, heldout=HELDOUT)
    held = [m for m in sink.of(Metrics) if "heldout/reward" in m.values]
    assert [m.step for m in held] == [1, 2]  # (it + 1) % 2 == 0, and the last iteration
    assert set(held[0].values) == {"heldout/reward", "heldout/gold", "heldout/kl", "heldout/length"}
    assert trainer.best is not None and trainer.best.metric == "heldout/gold"


def test_the_same_policy_gets_the_same_heldout_figures(tiny_tokenizer):
    trainer = _trainer(tiny_tokenizer)
    assert heldout_stats(trainer, HELDOUT, judge) == heldout_stats(trainer, HELDOUT, judge)  # the same draws
    # The reference is the starting policy: KL ~ 0 before any update.
    assert abs(heldout_stats(trainer, HELDOUT, None)["heldout/kl"]) < 1e-4


def test_consider_keeps_the_best_and_copies_its_weights(tiny_tokenizer):
    trainer = _trainer(tiny_tokenizer)
    first = consider(None, trainer, {"heldout/gold": -3.0}, 1, judged=True)
    assert first.iteration == 1 and first.value == -3.0
    assert consider(first, trainer, {"heldout/gold": -4.0}, 3, judged=True) is first  # worse: unchanged
    better = consider(first, trainer, {"heldout/gold": -2.0}, 3, judged=True)
    assert better.iteration == 3
    # A copy: training the policy further does not change the kept weights.
    name, before = next(iter(better.state.items()))
    with torch.no_grad():
        trainer.export_policy().state_dict()[name].add_(1.0)
    assert torch.equal(better.state[name], before)
    assert consider(None, trainer, {"heldout/reward": 0.5}, 0, judged=False).metric == "heldout/reward"


def test_keep_best_saves_the_best_policy_and_says_which(tiny_tokenizer, tmp_path):
    trainer, sink = _trainer(tiny_tokenizer), Recorder()
    ppo_loop(trainer, sink, 4, tmp_path, judge, heldout=HELDOUT)
    best = trainer.best
    policy = kept_policy(trainer, sink)
    for k, v in policy.state_dict().items():
        assert torch.equal(v.cpu(), best.state[k]), k
    kept = [t.tags["rlhf.kept"] for t in sink.of(Tags) if "rlhf.kept" in t.tags]
    assert kept == [f"best: iteration {best.iteration} (heldout/gold = {best.value:.4f}), of 4 iterations"]
    golds = {m.step: m.values["heldout/gold"] for m in sink.of(Metrics) if "heldout/gold" in m.values}
    assert best.value == max(golds.values()) and golds[best.iteration] == best.value


def test_the_best_policy_survives_a_checkpoint(tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_tokenizer)
    ppo_loop(trainer, Recorder(), 2, tmp_path / "run", judge, heldout=HELDOUT)
    path = save_checkpoint(trainer, tmp_path / "ckpt")
    resumed = _trainer(tiny_tokenizer)
    load_checkpoint(resumed, path)
    assert isinstance(resumed.best, BestPolicy)
    assert (resumed.best.iteration, resumed.best.value) == (trainer.best.iteration, trainer.best.value)
    assert all(torch.equal(resumed.best.state[k], v) for k, v in trainer.best.state.items())


def test_keep_best_needs_eval_every():
    with pytest.raises(ValueError, match="ppo.keep=best needs ppo.eval_every"):
        PPOConfig(keep="best")
