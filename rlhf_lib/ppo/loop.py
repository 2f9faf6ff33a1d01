"""The PPO loop, defined once: the phases of an iteration, the iterations with their alarms and checkpoints, and a
whole PPO run from saved SFT and reward models to the saved policy.

Every way of running PPO goes through here: `PPOTrainer.step` and the benchmark call `run_iteration` bare, the
PPO stage runs each phase as a Prefect task (its `call`), and the processes of a launched group run `launched`.
The loop reports through a typed event sink (`rlhf_lib.events`) and knows nothing of where the events go.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data.conversations import reward_rendering
from rlhf_lib.devices import DTYPES, weights_dtype
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.events import Checkpoint, Metrics, Notice, Resumed, Sink, Table, Tags
from rlhf_lib.intervals import standard_error
from rlhf_lib.lm.generation import decode_responses
from rlhf_lib.model_dirs import load_causal_lm, load_reward_side, save_model
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.alarms import AlarmMonitor
from rlhf_lib.ppo.checkpoint import checkpoint_dir, load_checkpoint, save_checkpoint
from rlhf_lib.ppo.heldout import consider, heldout_stats
from rlhf_lib.ppo.metrics import sample_rows
from rlhf_lib.ppo.trainer import Call, PPOTrainer, direct
from rlhf_lib.ppo.types import PPOModels, Rollout
from rlhf_lib.rewards.judge import load_judge

# The phases of one iteration, in order, as the Prefect tasks are named and the timings logged (`time/<phase>_s`).
PHASES = ("rollout", "score", "gae", "update")
Judge = Callable[[str, str], float]


def run_iteration(trainer: PPOTrainer, call: Call = direct) -> tuple[Rollout, dict[str, float]]:
    """One PPO iteration: `PPOTrainer.step`, the page that calls the phases in order (rlhf_lib/ppo/trainer.py)."""
    return trainer.step(call)


def ppo_loop(trainer: PPOTrainer, sink: Sink | None, iterations: int, checkpoints: Path, judge: Judge | None = None,
             call: Call = direct, heldout: Sequence[str] = ()) -> None:
    """Iterations from `trainer.iteration` (a resumed trainer continues where its checkpoint left off) to
    `iterations`. Each reports its metrics, samples and alarms to `sink`, and checkpoints are saved under
    `checkpoints` and announced to it. The gold judge (demo task only) scores the samples for monitoring, never
    the policy's reward. `sink` is None on the processes of a launched group other than the main one: they follow
    the main process's decision to stop. `heldout`: the prompts of the evaluation during PPO (`ppo.eval_every`)."""
    monitor, raised = AlarmMonitor(trainer.cfg), set()
    for it in range(trainer.iteration, iterations):
        ro, stats = run_iteration(trainer, call)
        stopping = (_report(trainer, sink, monitor, raised, it, ro, stats, judge, iterations, checkpoints, heldout)
                    if sink else False)
        if trainer.group.broadcast(stopping):
            return


def _report(trainer: PPOTrainer, sink: Sink, monitor: AlarmMonitor, raised: set[str], it: int, ro: Rollout,
            stats: dict[str, float], judge: Judge | None, iterations: int, checkpoints: Path,
            heldout: Sequence[str] = ()) -> bool:
    """Report one iteration (samples, metrics, held-out evaluation, alarms, checkpoint); return whether the loop
    stops on an alarm."""
    c, tokenizer = trainer.cfg, trainer.models.tokenizer
    if judge is not None:
        gold = [judge(p, t) for p, t in zip(ro.prompts, decode_responses(tokenizer, ro.response, ro.response_mask))]
        stats["objective/gold"] = sum(gold) / len(gold)
        stats["objective/gold_sem"] = standard_error(gold)
    if it % c.sample_every == 0 or it == iterations - 1:
        rows = sample_rows(ro, tokenizer, 8)
        if judge is not None:
            for r, g in zip(rows, gold):
                r["gold"] = g
        sink.emit(Table(rows, f"samples/iter_{it:04d}.json"))
    sink.emit(Metrics(stats, it))
    if heldout and c.eval_every and ((it + 1) % c.eval_every == 0 or it == iterations - 1):
        held = heldout_stats(trainer, heldout, judge)
        sink.emit(Metrics(held, it))
        if c.keep == "best":
            trainer.best = consider(trainer.best, trainer, held, it, judge is not None)
    alarms = monitor.check(it, stats)
    for alarm in alarms:
        sink.emit(Notice(f"PPO alarm {alarm.name} at {alarm}"))
        if alarm.name not in raised:  # the tag keeps the first occurrence; the log has every one
            sink.emit(Tags({f"rlhf.alarm.{alarm.name}": str(alarm)}))
            raised.add(alarm.name)
    stopping = bool(alarms) and c.stop_on_alarm
    healthy = not any(a.name == "nan" for a in alarms)  # a non-finite state is never checkpointed
    if healthy and ((it + 1) % c.checkpoint_every == 0 or it == iterations - 1 or stopping):
        path = save_checkpoint(trainer, checkpoint_dir(checkpoints, trainer.iteration))
        sink.emit(Checkpoint(str(path), trainer.iteration))
    if stopping:
        sink.emit(Tags({"rlhf.stopped_on_alarm": f"iteration {it}: {', '.join(a.name for a in alarms)}"}))
    return stopping


@dataclass
class PPOJob:
    """Everything a PPO run needs, JSON-able (it is the job file of a launched run): the config, the saved SFT and
    reward models, the training prompts and demonstrations (PPO-ptx), the task whose gold judge monitors the samples
    (`rlhf_lib.tasks`; "" for none, or a task without one), where the final policy goes, the checkpoints to resume from (newest first) and the held-out prompts
    of the evaluation during PPO."""

    config: dict[str, Any]
    sft_dir: str
    reward_dir: str | None  # None: no reward source of kind model (ppo.rewards)
    prompts: list[str]
    out_dir: str
    ptx: list[tuple[str, str]] = field(default_factory=list)
    task: str = ""  # the task that built the data (`rlhf_lib.tasks.task_named`): its gold judge, if any
    resume: list[str] = field(default_factory=list)
    eval_prompts: list[str] = field(default_factory=list)  # the held-out prompts of ppo.eval_every
    columns: dict[str, dict[str, Any]] = field(default_factory=dict)  # the prompts' extra fields, by prompt text
    # the messages of each rendered prompt, for an RM with its own tokenizer (rlhf_lib.data.conversations)
    conversations: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    judges: dict[str, str] = field(default_factory=dict)  # each `kind: judge` source's local model folder

    @cached_property
    def cfg(self) -> PipelineConfig:
        """`config` validated, once per job: the stage dumped it to JSON (`PipelineConfig.model_dump(mode="json")`)
        because a launched run reads the job from a file; every reader of the job takes this."""
        return PipelineConfig.model_validate(self.config)

    @classmethod
    def from_dict(cls, job: dict[str, Any]) -> PPOJob:
        return cls(**{**job, "ptx": [tuple(e) for e in job.get("ptx", [])]})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_models(cfg: PipelineConfig, sft_dir: Path, reward_dir: Path | None) -> PPOModels:
    """Policy and frozen reference from SFT (no reference copy with LoRA), the frozen reward model (with its own
    tokenizer when it differs from the policy's; none without `reward_dir`, when no reward source is a model), and
    the critic the config asks for: a value model initialised from the RM (InstructGPT; from SFT when the RM reads
    other token ids or there is no RM) or from SFT, or none (a shared value head, grpo, rloo). The trained models load in `model.dtype`, the frozen ones in `resources.frozen_dtype`; all
    on the CPU (the trainer places them)."""
    dtype, frozen = weights_dtype(cfg.model.dtype), DTYPES[cfg.resources.frozen_dtype]
    policy, tokenizer = load_causal_lm(sft_dir, cfg.model.trust_remote_code, dtype)
    # LoRA: the reference is the policy with its adapters off, so there is no copy.
    ref = None if cfg.ppo.lora else copy.deepcopy(policy).to(frozen)
    if reward_dir is None:
        reward, value, reward_tokenizer = None, None, None
    else:
        reward, value, reward_tokenizer = load_reward_side(reward_dir, policy, tokenizer,
                                                           cfg.reward.trust_remote_code, dtype, frozen)
    if not (cfg.ppo.has_critic and cfg.ppo.critic == "separate"):
        value = None
    elif value is None or (cfg.ppo.value_init == "sft" and reward_tokenizer is None):
        value = build_scalar_model(policy)
    return PPOModels(policy=policy, ref=ref, reward=reward, value=value, tokenizer=tokenizer,
                     reward_tokenizer=reward_tokenizer)


def build_trainer(job: PPOJob, group: ProcessGroup | None = None) -> PPOTrainer:
    cfg = job.cfg
    models = load_models(cfg, Path(job.sft_dir), Path(job.reward_dir) if job.reward_dir else None)
    frozen = DTYPES[cfg.resources.frozen_dtype]
    models.judges = {s.name: load_judge(s, job.judges[s.name], frozen) for s in cfg.ppo.rewards if s.kind == "judge"}
    if models.reward_tokenizer is not None:  # an RM with its own tokenizer reads its own chat template
        models.reward_rendering = reward_rendering(job.conversations, False, models.reward_tokenizer,
                                                   cfg.data.render, models.tokenizer)
    group = group or ProcessGroup(device=cfg.resources.device)
    return PPOTrainer(models, job.prompts, cfg.ppo, max_prompt_tokens=cfg.model.n_positions - cfg.ppo.response_tokens,
                      ptx_examples=job.ptx, ptx_max_length=cfg.sft.max_length, group=group,
                      mixed_precision=cfg.resources.mixed_precision,
                      frozen_dtype=DTYPES[cfg.resources.frozen_dtype], columns=job.columns)


def load_first(trainer: PPOTrainer, candidates: Sequence[Path]) -> Path | None:
    """Load the first checkpoint of `candidates` (newest first) that loads cleanly; None if none does.
    `load_checkpoint` validates everything before it changes the trainer, so a bad one leaves it untouched."""
    for ckpt in candidates:
        try:
            load_checkpoint(trainer, ckpt)
            return ckpt
        except ValueError:
            continue
    return None


def train_ppo(job: PPOJob, sink: Sink | None, workdir: Path, call: Call = direct,
              group: ProcessGroup | None = None) -> None:
    """A whole PPO run: build the trainer, resume from the newest loadable checkpoint of `job.resume`, loop, and
    save the final policy (LoRA merged in) to `job.out_dir` as a plain transformers directory. Checkpoints are
    written under `workdir/checkpoints`."""
    from rlhf_lib.tasks import task_named

    cfg = job.cfg
    gold = task_named(job.task).gold if job.task else None  # the task's own judge: monitoring only
    trainer = build_trainer(job, group)
    if job.resume:
        ckpt = load_first(trainer, [Path(p) for p in job.resume])
        if sink is not None:
            sink.emit(Resumed(ckpt.name if ckpt else None, trainer.iteration))
        trainer.sync_engine()
    heldout = job.eval_prompts[: cfg.ppo.eval_prompts] if cfg.ppo.eval_every else []
    try:
        ppo_loop(trainer, sink, cfg.ppo.iterations, workdir / "checkpoints", gold.score if gold else None, call,
                 heldout)
    finally:
        trainer.close()
    if trainer.group.is_main:
        save_model(kept_policy(trainer, sink), trainer.models.tokenizer, Path(job.out_dir))
    if (rendering := trainer.models.reward_rendering) is not None and sink is not None:
        # How many scored prompts the RM read through its own template (a prompt cut to fit the context is not).
        sink.emit(Tags({"rlhf.reward.rendering": f"own {'chat template' if rendering.templated else 'hh text'}: {rendering.rendered} prompts, "
                        f"{rendering.misses} scored as the policy's text"}))


def kept_policy(trainer: PPOTrainer, sink: Sink | None):
    """The policy to save: the final one, or with `ppo.keep: best` the best evaluated one (its weights loaded into
    the exported model), announced to `sink` as the `rlhf.kept` tag."""
    policy = trainer.export_policy()
    best = trainer.best
    if trainer.cfg.keep != "best" or best is None:
        if sink is not None and trainer.cfg.keep == "best":
            sink.emit(Tags({"rlhf.kept": "final: no held-out evaluation ran"}))
        return policy
    policy.load_state_dict(best.state)
    if sink is not None:
        sink.emit(Tags({"rlhf.kept": f"best: {best.describe()}, of {trainer.iteration} iterations"}))
    return policy


def launched(job: dict[str, Any], workdir: Path, sink: Sink) -> None:
    """One process of a PPO run under `accelerate launch` (the launcher's entry point): every process builds the
    same trainer and loops; the main one reports to `sink` and saves the final policy. The processes are on
    `resources.device` (one GPU each, NCCL; or CPU processes joined by gloo)."""
    ppo_job = PPOJob.from_dict(job)
    group = ProcessGroup(device=ppo_job.cfg.resources.device)
    train_ppo(ppo_job, sink if group.is_main else None, workdir, group=group)
    group.barrier()
    group.close()
