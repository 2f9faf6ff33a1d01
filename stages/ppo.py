"""PPO stage: a Prefect sub-flow that loops the tasks rollout -> score -> gae -> update once per iteration.

The tasks share one in-memory `PPOTrainer` (models, optimizer, KL controller) and hand the `Rollout` tensors to
each other directly: caching is off and nothing is persisted, so a task call costs milliseconds, and no model or
tensor is ever JSON-encoded as a flow parameter. With `resources.num_processes > 1` the loop runs instead under
`accelerate launch` as one task, `ppo-launch` (stages.ppo_loop.worker), whose reports this process logs to MLflow.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_prompts, read_sft
from rlhf_lib.data.collate import prompt_truncations
from rlhf_lib.demo_task import FILE_NAMES, gold_score
from rlhf_lib.models import load_tokenizer
from rlhf_lib.ppo.checkpoint import checkpoint_dir, save_checkpoint
from rlhf_lib.ppo.distributed import check_sizes
from rlhf_lib.ppo.trainer import PPOTrainer
from rlhf_lib.ppo.types import Rollout
from stages.base import RunContext, as_state, log_dataset, run_cached
from stages.cache import StageResult
from stages.data import file_digest, has_judge
from stages.launch import run_job
from stages.models_io import save_model
from stages.ppo_loop import build_trainer, ppo_job, ppo_loop
from stages.resume import COMPLETE_MARKER, resumable, resume, resumed
from stages.tracking import StageRun, download

_IN_MEMORY = dict(cache_policy=NO_CACHE, persist_result=False, log_prints=False)


@task(name="rollout", **_IN_MEMORY)
def rollout_task(trainer: PPOTrainer) -> Rollout:
    """1. generate: sample responses to a batch of prompts, with their log-probs."""
    return trainer.rollout()


@task(name="score", **_IN_MEMORY)
def score_task(trainer: PPOTrainer, ro: Rollout) -> Rollout:
    """2. score: reference log-probs, values and reward-model scores."""
    trainer.score(ro)
    return ro


@task(name="gae", **_IN_MEMORY)
def gae_task(trainer: PPOTrainer, ro: Rollout) -> dict[str, float]:
    """3. rewards (KL-shaped) and 4. GAE advantages; updates the KL controller."""
    return trainer.advantages(ro)


@task(name="update", **_IN_MEMORY)
def update_task(trainer: PPOTrainer, ro: Rollout) -> dict[str, float]:
    """5. update: epochs x minibatches of clipped PPO steps."""
    return trainer.update(ro)


LOOP_TASKS = frozenset(t.name for t in (rollout_task, score_task, gae_task, update_task))


class QuietLoopTasks(logging.Filter):
    """Drops the records below WARNING that Prefect's task engine logs for the loop's four tasks: its "Finished in
    state Completed()" line, four per PPO iteration. The task runs and their states still reach the server (the UI
    shows every one); a failed task still logs its error. Without them a 1 s iteration spends ~7 ms less on console
    and API logging here, and the server stores four log rows less."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or getattr(record, "task_name", None) not in LOOP_TASKS


_QUIET = QuietLoopTasks()


def quiet_loop_task_logs() -> None:
    """Attach `QuietLoopTasks` to Prefect's task-run logger (idempotent; re-attached if Prefect reset it)."""
    logger = logging.getLogger("prefect.task_runs")
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)


def iteration_tasks(trainer: PPOTrainer) -> tuple[Rollout, dict[str, float]]:
    """One PPO iteration as the sub-flow's four tasks: rollout -> score -> gae -> update."""
    quiet_loop_task_logs()
    ro = score_task(trainer, rollout_task(trainer))
    stats = gae_task(trainer, ro)
    stats.update(update_task(trainer, ro))
    return ro, stats


class RunSink:
    """The loop's sink in the stage's process: the MLflow run and Prefect's log (see stages.ppo_loop.Sink)."""

    def __init__(self, run: StageRun):
        self.run = run

    def metrics(self, stats: dict[str, float], step: int) -> None:
        self.run.log_metrics(stats, step=step)

    def table(self, rows: list[dict], path: str) -> None:
        self.run.log_table(rows, path)

    def tags(self, tags: dict[str, str]) -> None:
        self.run.set_tags(tags)

    def warn(self, message: str) -> None:
        get_run_logger().warning(message)

    def checkpoint(self, trainer: PPOTrainer) -> None:
        """Save the trainer's whole state (no pickle) and log it to the PPO run as `checkpoints/iter_NNNNNN/`."""
        with tempfile.TemporaryDirectory(prefix="rlhf-ckpt-") as tmp:
            self.checkpoint_dir(save_checkpoint(trainer, checkpoint_dir(Path(tmp), trainer.iteration)))

    def checkpoint_dir(self, path: Path) -> None:
        self.run.log_dir(path, f"checkpoints/{path.name}")
        # Logged last: a process killed while the files were being copied leaves no marker, and resume skips it.
        self.run.log_text(path.name, f"checkpoints/{path.name}/{COMPLETE_MARKER}")


def _build(cfg: PipelineConfig, data_dir: Path, data: StageResult, sft_dir: Path, reward_dir: Path):
    def build(run: StageRun, out_dir: Path) -> None:
        check_sizes(cfg.ppo, cfg.resources.num_processes)  # before any model is loaded or process launched
        prompts = [p.prompt for p in read_prompts(data_dir / FILE_NAMES["prompts_train"]).rows]
        ptx = ([(e.prompt, e.response) for e in read_sft(data_dir / FILE_NAMES["sft"]).rows]
               if cfg.ppo.ptx_coef > 0 else [])
        log_dataset(run, [{"prompt": p} for p in prompts], f"{data.artifact_uri}/{FILE_NAMES['prompts_train']}",
                    "demo-prompts-train", "training", file_digest(data_dir, "prompts_train"))
        key = run.run.data.tags["rlhf.cache_key_pending"]
        max_prompt = cfg.model.n_positions - cfg.ppo.max_new_tokens
        tokenizer = load_tokenizer(sft_dir, trust_remote_code=cfg.model.trust_remote_code)
        run.log_metrics({"ppo/truncated_prompts": prompt_truncations(tokenizer, prompts, max_prompt)}, step=0)
        if cfg.resources.num_processes > 1:
            launch_task(cfg, run, key, sft_dir, reward_dir, prompts, ptx, has_judge(data_dir), out_dir)
            return
        trainer = build_trainer(cfg, sft_dir, reward_dir, prompts, ptx)
        start = resume(trainer, run, run.run.info.experiment_id, key)
        if start:
            get_run_logger().info("ppo: resumed an interrupted run at iteration %d", start)
            trainer.sync_engine()
        judge = gold_score if has_judge(data_dir) else None
        try:
            ppo_loop(trainer, RunSink(run), cfg.ppo.iterations, judge, iterate=iteration_tasks)
        finally:
            if trainer.engine is not None:
                trainer.engine.close()
        save_model(trainer.export_policy(), trainer.m.tokenizer, out_dir)
    return build


@task(name="ppo-launch", **_IN_MEMORY)
def launch_task(cfg: PipelineConfig, run: StageRun, key: str, sft_dir: Path, reward_dir: Path, prompts: list[str],
                ptx: list[tuple[str, str]], judge: bool, out_dir: Path) -> None:
    """The whole PPO loop in `resources.num_processes` processes under `accelerate launch` (stages.ppo_loop.worker):
    one task, since the per-phase tasks cannot span processes. Resumes an interrupted run as in one process: this
    process finds and downloads the checkpoints, the launched ones load them. The events the main launched process
    writes are replayed onto the run as they come; the final policy lands in `out_dir`."""
    found = resumable(run, run.run.info.experiment_id, key)
    job = ppo_job(cfg, sft_dir, reward_dir, prompts, ptx, judge, out_dir, found[1] if found else ())
    sink, logger = RunSink(run), get_run_logger()

    def handle(row: dict[str, Any]) -> None:
        event, args = row["event"], row["args"]
        if event == "resumed":
            resumed(run, found[0], *args)
            if args[0] is not None:
                logger.info("ppo: resumed an interrupted run at iteration %d", args[1])
        elif event == "checkpoint_dir":
            sink.checkpoint_dir(Path(args[0]))
            shutil.rmtree(args[0], ignore_errors=True)
        else:
            getattr(sink, event)(*args)

    # PPO's processes are CPU processes joined by gloo, whatever resources.accelerate_config says for SFT and RM
    # (the trainer runs on the CPU, in one process too), in float32: its rollout log-probs and update must use the
    # same numerics, so resources.mixed_precision does not apply either.
    resources = cfg.resources.model_copy(update={"accelerate_config": "cpu_gloo.yaml"})
    with tempfile.TemporaryDirectory(prefix="rlhf-ppo-launch-") as tmp:
        run_job(job, resources, Path(tmp), handle, cfg.torch_threads, mixed_precision="no")


@flow(name="ppo", flow_run_name="ppo-{config.name}")
def ppo_stage(
    config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult, reward: StageResult
) -> StageResult:
    """PPO against the frozen reward model, as a loop of rollout -> score -> gae -> update tasks."""
    data_dir = download(data.artifact_uri)
    sft_dir, reward_dir = download(sft.artifact_uri), download(reward.artifact_uri)
    section = {"ppo": config.ppo.model_dump(), "n_positions": config.model.n_positions,
               "ptx_max_length": config.sft.max_length if config.ppo.ptx_coef > 0 else None}
    result, _ = run_cached(ctx, "ppo", section, {"sft": sft, "reward": reward},
                           file_digest(data_dir, "prompts_train"), _build(config, data_dir, data, sft_dir, reward_dir))
    return as_state(result)
