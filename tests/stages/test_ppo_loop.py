"""PPO under `accelerate launch` with 2 CPU processes (gloo) against the same loop in one process.

Both runs start from the same saved models and seed, so they sample the same tokens (each process draws its rows
of the global noise) and see the same global rollout; what differs is float summation order (batch composition
of the forward passes, the split of each minibatch over processes, gloo's sums). Hence the tolerances: metrics
agree to rel 1e-4 / abs 1e-5, final weights to 1e-4 / 1e-5 (they move by ~1e-2). Clip fractions are counts of
tokens on either side of a threshold, where float noise can move a token across (the loss is continuous there):
they get an absolute tolerance of a few tokens.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhf_lib.config import PipelineConfig, ResourcesConfig
from rlhf_lib.events import Checkpoint, Metrics, Recorder, Resumed
from rlhf_lib.model_dirs import load_causal_lm, save_model
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.checkpoint import load_checkpoint
from rlhf_lib.ppo.loop import PPOJob, build_trainer, launched, ppo_loop
from stages.launch import run_job

TWO = ResourcesConfig(num_processes=2, accelerate_config="cpu_gloo.yaml")
PROMPTS = [f"\n\nHuman: tell me about topic {i}" + " please" * (i % 3) + "\n\nAssistant:" for i in range(12)]
DEMOS = [(p, " Sure, topic 1 is nice.") for p in PROMPTS]
BASE = dict(iterations=3, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3, rm_offset_samples=0)


def _models(tmp: Path, tokenizer, policy) -> tuple[Path, Path]:
    rm = build_scalar_model(policy, seed=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    save_model(policy, tokenizer, tmp / "sft")
    save_model(rm, tokenizer, tmp / "rm")
    return tmp / "sft", tmp / "rm"


def _config(**ppo) -> PipelineConfig:
    return PipelineConfig.model_validate({"model": {"n_positions": 64}, "sft": {"max_length": 48},
                                          "ppo": {**BASE, **ppo}})


def _job(tmp: Path, cfg: PipelineConfig, sft: Path, rm: Path, resume=()) -> PPOJob:
    return PPOJob(config=cfg.model_dump(mode="json"), sft_dir=str(sft), reward_dir=str(rm), prompts=PROMPTS,
                  out_dir=str(tmp / "out"), ptx=DEMOS if cfg.ppo.ptx_coef else [], resume=[str(p) for p in resume])


def _launch(tmp: Path, cfg: PipelineConfig, sft: Path, rm: Path, resume=()) -> Recorder:
    events = Recorder()
    (tmp / "launch").mkdir()
    run_job(launched, _job(tmp, cfg, sft, rm, resume).to_dict(), TWO, tmp / "launch", events, torch_threads=2,
            mixed_precision="no")
    return events


def _one(tmp: Path, cfg: PipelineConfig, sft: Path, rm: Path):
    """The same run in this process, bare: its trainer and events (checkpoints under tmp/one)."""
    one = Recorder()
    trainer = build_trainer(_job(tmp, cfg, sft, rm))
    ppo_loop(trainer, one, cfg.ppo.iterations, tmp / "one")
    return trainer, one


def _assert_same_metrics(one: list[Metrics], two: list[Metrics]) -> None:
    assert [m.step for m in two] == [m.step for m in one]
    for a, b in ((x.values, y.values) for x, y in zip(one, two)):
        assert a.keys() == b.keys()
        for k in a:
            if k.startswith("time/"):
                continue
            tol = dict(abs=0.05) if "clipfrac" in k else dict(rel=1e-4, abs=1e-5)
            assert b[k] == pytest.approx(a[k], **tol), k


def _assert_same_weights(trainer, out: Path, start: dict) -> None:
    launched, _ = load_causal_lm(out)
    w1, w2 = trainer.export_policy().state_dict(), launched.state_dict()
    assert any(not torch.equal(start[k], w1[k]) for k in w1)  # it trained
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5)


def test_ppo_two_gloo_processes_match_one(tmp_path, tiny_tokenizer, tiny_policy):
    # The default critic (a value model from the RM), with every global statistic in play: the RM offset from
    # sharded samples, running reward whitening, ptx on a sharded demonstration batch, 2 micro-batches per process.
    sft, rm = _models(tmp_path, tiny_tokenizer, tiny_policy)
    cfg = _config(rm_offset_samples=8, whiten_rewards=True, ptx_coef=0.1, ptx_batch_size=4,
                  gradient_accumulation_steps=2, checkpoint_every=2)
    trainer, one = _one(tmp_path, cfg, sft, rm)
    events = _launch(tmp_path, cfg, sft, rm)
    _assert_same_metrics(one.of(Metrics), events.of(Metrics))
    assert one.of(Metrics)[-1].values["objective/kl_coef"] != cfg.ppo.kl_coef  # the adaptive beta moved, alike
    _assert_same_weights(trainer, tmp_path / "out", copy.deepcopy(tiny_policy.state_dict()))
    # The main process saved checkpoints after iterations 2 and 3; the last holds the launched run's final state
    # and loads into a one-process trainer.
    ckpts = [Path(e.path) for e in events.of(Checkpoint)]
    assert [c.name for c in ckpts] == ["iter_000002", "iter_000003"]
    load_checkpoint(trainer, ckpts[-1])
    launched, _ = load_causal_lm(tmp_path / "out")
    assert all(torch.equal(v, launched.state_dict()[k]) for k, v in trainer.export_policy().state_dict().items())


def test_launched_ppo_resumes_a_one_process_checkpoint(tmp_path, tiny_tokenizer, tiny_policy):
    # A value head on the policy (DDP on the head, the policy run without gradient during the critic warm-up),
    # LoRA adapters, and the approximate-KL early stop; the launch resumes from iteration 1 of a one-process run,
    # skipping a damaged newer checkpoint, and continues as that run did.
    sft, rm = _models(tmp_path, tiny_tokenizer, tiny_policy)
    cfg = _config(critic="shared", critic_warmup=1, lora=True, lr=1e-2, early_stop_kl=1e-6, checkpoint_every=1)
    trainer, one = _one(tmp_path, cfg, sft, rm)
    checkpoints = [Path(e.path) for e in one.of(Checkpoint)]
    damaged = checkpoints[1]
    (damaged / "policy.safetensors").write_bytes(b"not a safetensors file")
    events = _launch(tmp_path, cfg, sft, rm, resume=[damaged, checkpoints[0]])
    assert events.of(Resumed) == [Resumed("iter_000001", 1)]
    _assert_same_metrics(one.of(Metrics)[1:], events.of(Metrics))
    assert any(m.values["update/epochs"] < cfg.ppo.epochs for m in one.of(Metrics))  # the early stop fired
    _assert_same_weights(trainer, tmp_path / "out", copy.deepcopy(tiny_policy.state_dict()))


def test_the_launched_worker_imports_neither_prefect_nor_mlflow():
    code = ("import sys, stages.launch, rlhf_lib.ppo.loop, rlhf_lib.sft, rlhf_lib.reward\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('prefect', 'mlflow')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
