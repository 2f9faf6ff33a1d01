"""Every PPO option runs, or is refused before any work with a message naming its key: one short iteration on the
micro preset's model for every value of every enumerated `ppo.*` option and every boolean turned on, alone, and the
options that interact (critic x estimator x LoRA x ptx) together, in one process and in two launched processes.

The micro model has 64 positions while `sft.max_length` is 96: PPO-ptx must fit its demonstrations to the policy.
"""

from __future__ import annotations

import itertools
import json
import math
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from pydantic import ValidationError

from flows.settings import load_config
from rlhf_lib.config import PPOConfig
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.events import Notice, Recorder, Sink
from rlhf_lib.model_dirs import save_model
from rlhf_lib.models import build_policy, build_scalar_model, train_tokenizer
from rlhf_lib.ppo.loop import PPOJob, build_trainer, run_iteration
from stages.launch import run_job

PROMPTS = [f"\n\nHuman: tell me about topic {i}\n\nAssistant:" for i in range(16)]
DEMOS = [(p, " Sure, topic 1 is nice. Thanks!" * 6) for p in PROMPTS]  # longer than the model's 64 positions
# Each case: one iteration, a quick RM offset, and the options under test.
BASE = {"iterations": 1, "rm_offset_samples": 4}
# Options that are off by default and take a value to be on.
ON = {"missing_eos_penalty": 1.0, "reward_clip": 1.0, "value_lr": 1e-4, "early_stop_kl": 1e-3, "critic_warmup": 1,
      "gradient_accumulation_steps": 2, "ent_coef": 0.01, "ptx_coef": 0.1, "rm_offset_samples": 0,
      "lora_target_modules": ["c_attn", "c_proj"], "value_init": "sft", "logprob_chunk": 4,
      "micro_batch_tokens": 64, "eval_every": 1}
# Values that need another key set to mean anything (refused without it, naming both).
NEEDS = {("keep", "best"): {"eval_every": 1}}


def _enumerated() -> list[dict[str, Any]]:
    """Every value of every Literal `ppo.*` option, every boolean flipped from its default, every option above on."""
    cases = []
    for name, field in PPOConfig.model_fields.items():
        ann = field.annotation
        if typing.get_origin(ann) is typing.Annotated:
            ann = typing.get_args(ann)[0]
        if typing.get_origin(ann) is Literal:
            cases += [{name: v, **NEEDS.get((name, v), {})} for v in typing.get_args(ann)]
        elif ann is bool:
            cases.append({name: not field.default})
    return cases + [{k: v} for k, v in ON.items()]


INTERACTING = [{"critic": c, "advantage_estimator": e, "lora": lora, "ptx_coef": ptx}
               for c, e, lora, ptx in itertools.product(("separate", "shared"), ("gae", "grpo", "rloo"),
                                                         (False, True), (0.0, 0.1))]


def _case_id(case: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items())


def try_case(case: dict[str, Any], models: Path, group: ProcessGroup | None = None) -> str:
    """"ran" or "refused: <message>"; any other failure raises. A refusal must come before any work and name a key."""
    try:
        cfg = load_config("micro", sets=[f"ppo.{k}={json.dumps(v)}" for k, v in {**BASE, **case}.items()]
                          + [f"resources.num_processes={group.world if group else 1}"])
    except (ValueError, ValidationError) as e:
        assert "ppo." in str(e) or "resources." in str(e), e
        return f"refused: {e}"
    job = PPOJob(config=cfg.model_dump(mode="json"), sft_dir=str(models / "sft"), reward_dir=str(models / "rm"),
                 prompts=PROMPTS, out_dir=str(models / "out"), ptx=DEMOS if cfg.ppo.ptx_coef else [])
    try:
        trainer = build_trainer(job, group)
    except ValueError as e:  # refused when the trainer is built: no iteration ran
        assert "ppo." in str(e) or "resources." in str(e), e
        return f"refused: {e}"
    _, stats = run_iteration(trainer)
    assert math.isfinite(stats["loss/total"]) and math.isfinite(stats["objective/kl"]), (case, stats)
    if cfg.ppo.ptx_coef:
        assert math.isfinite(stats["loss/ptx"])
    return "ran"


def matrix_worker(job: dict[str, Any], workdir: Path, sink: Sink) -> None:
    """Entry point of the launched processes: every case of `job`, in lockstep, outcomes to the main's sink."""
    group = ProcessGroup(device="cpu")
    for case in job["cases"]:
        outcome = try_case(case, Path(job["models"]), group)
        if group.is_main:
            sink.emit(Notice(json.dumps({"case": case, "outcome": outcome})))
    group.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The micro preset's model shapes, saved as the SFT and reward stages would."""
    tmp = tmp_path_factory.mktemp("options")
    m = load_config("micro").model
    tokenizer = train_tokenizer([p + r for p, r in DEMOS], m.vocab_size)
    policy = build_policy(tokenizer, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, n_positions=m.n_positions)
    rm = build_scalar_model(policy, seed=1)
    torch.nn.init.normal_(rm.score.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    save_model(policy, tokenizer, tmp / "sft")
    save_model(rm, tokenizer, tmp / "rm")
    return tmp


@pytest.mark.parametrize("case", _enumerated() + INTERACTING, ids=_case_id)
def test_one_process(case, models):
    outcome = try_case(case, models)
    if case.get("rollout_engine") == "vllm":
        assert outcome.startswith("refused") and "ppo.rollout_engine" in outcome  # vLLM is not installed here
    else:
        assert outcome == "ran"


def test_two_launched_processes(models):
    from rlhf_lib.config import ResourcesConfig

    events = Recorder()
    (models / "launch").mkdir()
    cases = INTERACTING + [{"rollout_engine": "vllm"}]
    run_job(matrix_worker, {"cases": cases, "models": str(models)},
            ResourcesConfig(num_processes=2, accelerate_config="cpu_gloo.yaml"), models / "launch", events,
            torch_threads=2, mixed_precision="no")
    outcomes = {_case_id(r["case"]): r["outcome"] for r in (json.loads(n.message) for n in events.of(Notice))}
    assert list(outcomes) == [_case_id(c) for c in cases]
    assert all(o == "ran" for c, o in outcomes.items() if "vllm" not in c), outcomes
    assert outcomes["rollout_engine=vllm"].startswith("refused")
