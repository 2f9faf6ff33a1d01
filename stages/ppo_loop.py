"""The PPO stage's loop without Prefect or MLflow: it runs in the stage's own process (resources.num_processes = 1)
and, under `accelerate launch`, in every launched process (`worker`).

The loop reports through a `Sink`. In the stage's process that is the MLflow run and Prefect's log
(`stages.ppo.RunSink`). In a launched group only the main process has one, an `EventSink` that appends each call
as a JSON line for the stage to replay onto its MLflow run while the launch goes on; the main process judges the
alarms and the other processes follow its decision to stop. Checkpoints are saved by the main process (DDP keeps
the weights and Adam moments identical in every process) and logged by the stage.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from rlhf_lib.config import PipelineConfig
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.alarms import AlarmMonitor
from rlhf_lib.ppo.checkpoint import checkpoint_dir, load_checkpoint, save_checkpoint
from rlhf_lib.ppo.rollout import decode_responses
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from rlhf_lib.ppo.types import Rollout
from stages.models_io import load_causal_lm, load_reward_side, save_model

Iterate = Callable[[PPOTrainer], tuple[Rollout, dict[str, float]]]


class Sink(Protocol):
    """Where the loop's results go: metrics per iteration, sample tables, tags, warnings and checkpoints."""

    def metrics(self, stats: dict[str, float], step: int) -> None: ...
    def table(self, rows: list[dict[str, Any]], path: str) -> None: ...
    def tags(self, tags: dict[str, str]) -> None: ...
    def warn(self, message: str) -> None: ...
    def checkpoint(self, trainer: PPOTrainer) -> None: ...


def load_models(cfg: PipelineConfig, sft_dir: Path, reward_dir: Path) -> PPOModels:
    """Policy and frozen reference from SFT (no reference copy with LoRA), the frozen reward model (with its own
    tokenizer when it differs from the policy's), and the critic the config asks for: a value model initialised
    from the RM (InstructGPT; from SFT when the RM reads other token ids) or from SFT, or none (a shared value
    head, grpo, rloo)."""
    policy, tokenizer = load_causal_lm(sft_dir, cfg.model.trust_remote_code)
    ref = None if cfg.ppo.lora else copy.deepcopy(policy)  # LoRA: the reference is the policy, adapters off
    reward, value, reward_tokenizer = load_reward_side(reward_dir, policy, tokenizer, cfg.reward.trust_remote_code)
    if not (cfg.ppo.has_critic and cfg.ppo.critic == "separate"):
        value = None
    elif cfg.ppo.value_init == "sft" and reward_tokenizer is None:
        value = build_scalar_model(policy)
    return PPOModels(policy=policy, ref=ref, reward=reward, value=value, tokenizer=tokenizer,
                     reward_tokenizer=reward_tokenizer)


def build_trainer(cfg: PipelineConfig, sft_dir: Path, reward_dir: Path, prompts: Sequence[str],
                  ptx: Sequence[tuple[str, str]], dist=None) -> PPOTrainer:
    models = load_models(cfg, sft_dir, reward_dir)
    return PPOTrainer(models, prompts, cfg.ppo, max_prompt_tokens=cfg.model.n_positions - cfg.ppo.max_new_tokens,
                      ptx_examples=ptx, ptx_max_length=cfg.sft.max_length, dist=dist)


def load_first(trainer: PPOTrainer, candidates: Sequence[Path]) -> Path | None:
    """Load the first checkpoint of `candidates` (newest first) that loads cleanly; None if none does.
    `load_checkpoint` validates everything before it changes the trainer, so a bad one leaves it untouched."""
    from safetensors import SafetensorError

    for ckpt in candidates:
        try:
            load_checkpoint(trainer, ckpt)
            return ckpt
        except (ValueError, OSError, SafetensorError):
            continue
    return None


def ppo_loop(trainer: PPOTrainer, sink: Sink | None, iterations: int, judge=None,
             iterate: Iterate = PPOTrainer.step) -> None:
    """One `iterate` (rollout -> score -> gae -> update) per iteration, its metrics to the sink. The gold judge
    (demo task only) scores logged samples, never the policy's reward. Alarms go to the sink as warnings and as
    `rlhf.alarm.<name>` tags. `sink` is None on the processes of a launched group other than the main one."""
    monitor, raised = AlarmMonitor(trainer.cfg), set()
    for it in range(trainer.iteration, iterations):  # a resumed trainer continues where its checkpoint left off
        ro, stats = iterate(trainer)
        stopping = _report(trainer, sink, monitor, raised, it, ro, stats, judge, iterations) if sink else False
        if trainer.dist.agree(stopping):  # every process stops with the main one
            return


def _report(trainer: PPOTrainer, sink: Sink, monitor: AlarmMonitor, raised: set[str], it: int, ro: Rollout,
            stats: dict[str, float], judge, iterations: int) -> bool:
    """Log one iteration (samples, metrics, alarms, checkpoint); return whether the loop stops on an alarm."""
    if judge is not None:  # monitoring only: the gold judge never enters the reward
        texts = decode_responses(trainer.m.tokenizer, ro.response, ro.response_mask)
        gold = [judge(p, t) for p, t in zip(ro.prompts, texts)]
        stats["objective/gold"] = sum(gold) / len(gold)
    if it % trainer.cfg.sample_every == 0 or it == iterations - 1:
        rows = trainer.samples(ro, 8)
        if judge is not None:
            for r, g in zip(rows, gold):
                r["gold"] = g
        sink.table(rows, f"samples/iter_{it:04d}.json")
    sink.metrics(stats, it)
    alarms = monitor.check(it, stats)
    for alarm in alarms:
        sink.warn(f"PPO alarm {alarm.name} at {alarm}")
        if alarm.name not in raised:  # the tag keeps the first occurrence; the log has every one
            sink.tags({f"rlhf.alarm.{alarm.name}": str(alarm)})
            raised.add(alarm.name)
    stopping = bool(alarms) and trainer.cfg.stop_on_alarm
    healthy = not any(a.name == "nan" for a in alarms)  # a non-finite state is never checkpointed
    if healthy and ((it + 1) % trainer.cfg.checkpoint_every == 0 or it == iterations - 1 or stopping):
        sink.checkpoint(trainer)
    if stopping:
        sink.tags({"rlhf.stopped_on_alarm": f"iteration {it}: {', '.join(a.name for a in alarms)}"})
    return stopping


class EventSink:
    """The main launched process's sink: each call becomes a line `{"event": name, "args": [...]}` of the job's
    events file, which the stage replays (stages.ppo); a checkpoint is saved under `root` and its directory sent."""

    def __init__(self, feed: IO[str], root: Path):
        self.feed, self.root = feed, root

    def _emit(self, event: str, *args: Any) -> None:
        self.feed.write(json.dumps({"event": event, "args": list(args)}) + "\n")
        self.feed.flush()

    def metrics(self, stats: dict[str, float], step: int) -> None:
        self._emit("metrics", stats, step)

    def table(self, rows: list[dict[str, Any]], path: str) -> None:
        self._emit("table", rows, path)

    def tags(self, tags: dict[str, str]) -> None:
        self._emit("tags", tags)

    def warn(self, message: str) -> None:
        self._emit("warn", message)

    def checkpoint(self, trainer: PPOTrainer) -> None:
        self._emit("checkpoint_dir", str(save_checkpoint(trainer, checkpoint_dir(self.root, trainer.iteration))))

    def resumed(self, name: str | None, iteration: int) -> None:
        self._emit("resumed", name, iteration)


def ppo_job(cfg: PipelineConfig, sft_dir: Path, reward_dir: Path, prompts: Sequence[str],
            ptx: Sequence[tuple[str, str]], judge: bool, out_dir: Path, resume: Sequence[Path] = ()) -> dict[str, Any]:
    """The job file of a launched PPO stage (JSON): config, where the models are, the data, and the checkpoints to
    resume from (newest first); the final policy is saved to `out_dir`."""
    return {"kind": "ppo", "config": cfg.model_dump(mode="json"), "sft_dir": str(sft_dir),
            "reward_dir": str(reward_dir), "prompts": list(prompts), "ptx": [list(e) for e in ptx], "judge": judge,
            "out_dir": str(out_dir), "resume": [str(p) for p in resume]}


def worker(job: dict[str, Any]) -> None:
    """One process of a PPO stage under `accelerate launch -m stages.launch JOB`: build the trainer (every process
    the same), resume from the job's checkpoints, loop; the main process reports and saves the final policy."""
    from rlhf_lib.demo_task import gold_score
    from rlhf_lib.ppo.distributed import Group
    from rlhf_lib.process import configure_process

    tmp = Path(job["dir"])
    configure_process(job["threads"])
    cfg = PipelineConfig.model_validate(job["config"])
    dist = Group()
    trainer = build_trainer(cfg, Path(job["sft_dir"]), Path(job["reward_dir"]), job["prompts"],
                            [tuple(e) for e in job["ptx"]], dist)
    with open(tmp / "metrics.jsonl", "a") as feed:
        sink = EventSink(feed, tmp / "checkpoints") if dist.is_main else None
        if job["resume"]:
            ckpt = load_first(trainer, [Path(p) for p in job["resume"]])
            if sink is not None:
                sink.resumed(ckpt.name if ckpt else None, trainer.iteration)
        ppo_loop(trainer, sink, cfg.ppo.iterations, gold_score if job["judge"] else None)
        if dist.is_main:
            save_model(trainer.export_policy(), trainer.m.tokenizer, Path(job["out_dir"]))
    dist.barrier()
    dist.acc.end_training()
