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
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.checkpoint import checkpoint_dir, load_checkpoint, save_checkpoint
from stages.launch import run_job
from stages.models_io import load_causal_lm, save_model
from stages.ppo_loop import build_trainer, ppo_job, ppo_loop

TWO = ResourcesConfig(num_processes=2, accelerate_config="cpu_gloo.yaml")
PROMPTS = [f"\n\nHuman: tell me about topic {i}" + " please" * (i % 3) + "\n\nAssistant:" for i in range(12)]
DEMOS = [(p, " Sure, topic 1 is nice.") for p in PROMPTS]
BASE = dict(iterations=3, batch_size=8, minibatches=2, epochs=2, max_new_tokens=6, lr=1e-3, rm_offset_samples=0)


class Recorder:
    """A sink that keeps what the loop reports (and, given a directory, saves checkpoints there)."""

    def __init__(self, root: Path | None = None):
        self.metrics_rows: list[tuple[int, dict[str, float]]] = []
        self.checkpoints: list[Path] = []
        self.root = root

    def metrics(self, stats, step):
        self.metrics_rows.append((step, stats))

    def table(self, rows, path):
        pass

    def tags(self, tags):
        pass

    def warn(self, message):
        pass

    def checkpoint(self, trainer):
        if self.root is not None:
            self.checkpoints.append(save_checkpoint(trainer, checkpoint_dir(self.root, trainer.iteration)))


def _models(tmp: Path, tokenizer, policy) -> tuple[Path, Path]:
    rm = build_scalar_model(policy, seed=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    save_model(policy, tokenizer, tmp / "sft")
    save_model(rm, tokenizer, tmp / "rm")
    return tmp / "sft", tmp / "rm"


def _config(**ppo) -> PipelineConfig:
    return PipelineConfig.model_validate({"model": {"n_positions": 64}, "sft": {"max_length": 48},
                                          "ppo": {**BASE, **ppo}})


def _launch(tmp: Path, cfg: PipelineConfig, sft: Path, rm: Path, resume=()) -> list[dict]:
    events: list[dict] = []
    (tmp / "launch").mkdir()
    job = ppo_job(cfg, sft, rm, PROMPTS, DEMOS if cfg.ppo.ptx_coef else [], False, tmp / "out", resume)
    run_job(job, TWO, tmp / "launch", events.append, torch_threads=2, mixed_precision="no")
    return events


def _assert_same_metrics(one: list[tuple[int, dict]], events: list[dict]) -> None:
    two = [(e["args"][1], e["args"][0]) for e in events if e["event"] == "metrics"]
    assert [s for s, _ in two] == [s for s, _ in one]
    for (_, a), (_, b) in zip(one, two):
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
    one = Recorder()
    trainer = build_trainer(cfg, sft, rm, PROMPTS, DEMOS)
    ppo_loop(trainer, one, cfg.ppo.iterations)
    events = _launch(tmp_path, cfg, sft, rm)
    _assert_same_metrics(one.metrics_rows, events)
    assert one.metrics_rows[-1][1]["objective/kl_coef"] != cfg.ppo.kl_coef  # the adaptive beta moved, alike
    _assert_same_weights(trainer, tmp_path / "out", copy.deepcopy(tiny_policy.state_dict()))
    # The main process saved checkpoints after iterations 2 and 3; the last holds the launched run's final state
    # and loads into a one-process trainer.
    ckpts = [Path(e["args"][0]) for e in events if e["event"] == "checkpoint_dir"]
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
    one = Recorder(tmp_path / "ckpt")
    trainer = build_trainer(cfg, sft, rm, PROMPTS, [])
    ppo_loop(trainer, one, cfg.ppo.iterations)
    damaged = one.checkpoints[1]
    (damaged / "policy.safetensors").write_bytes(b"not a safetensors file")
    events = _launch(tmp_path, cfg, sft, rm, resume=[damaged, one.checkpoints[0]])
    assert [e["args"] for e in events if e["event"] == "resumed"] == [["iter_000001", 1]]
    _assert_same_metrics(one.metrics_rows[1:], events)
    assert any(m["update/epochs"] < cfg.ppo.epochs for _, m in one.metrics_rows)  # the early stop fired
    _assert_same_weights(trainer, tmp_path / "out", copy.deepcopy(tiny_policy.state_dict()))


def test_the_launched_worker_imports_neither_prefect_nor_mlflow():
    code = ("import sys, stages.launch, stages.ppo_loop\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('prefect', 'mlflow')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
