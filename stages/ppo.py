"""PPO stage: a Prefect sub-flow whose iterations run as the tasks rollout -> score -> gae -> update.

The loop itself is `rlhf_lib.ppo.loop`; this module adds what talks to Prefect and MLflow: each phase as a task, the
sink that logs the loop's events to the stage's MLflow run, and resuming an interrupted run (`stages.resume`). The
tasks share one in-memory trainer and hand the rollout's tensors to each other directly: caching is off and nothing
is persisted, so a task call costs milliseconds, and no model or tensor is ever JSON-encoded as a flow parameter.
With `resources.num_processes > 1`, or on several machines, the whole loop runs instead under `accelerate launch` as
one task, `ppo-launch`, whose events this process logs as they come.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rlhf_lib.config import PipelineConfig
from rlhf_lib.config.base import KEEP_SECRETS
from rlhf_lib.data import read_prompts, read_sft
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.collate import prompt_truncations
from rlhf_lib.envs import environment_digest
from rlhf_lib.models import load_tokenizer
from rlhf_lib.ppo.loop import PHASES, PPOJob, launched, train_ppo
from rlhf_lib.ppo.sharding import check_sizes
from rlhf_lib.rewards.functions import reward_code
from stages.artifact_cache import download
from stages.base import as_state, log_dataset
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.data import (
    conversations,
    conversations_digest,
    dataset_name,
    data_task,
    file_digest,
    prompt_columns,
)
from stages.follower import FollowerRun, launch_id_of, pending_key
from stages.ppo_sink import PPORunSink
from stages.inputs import StageInputs, frozen, memory_check, run_stage
from stages.launch import default_config, run_job
from stages.models_io import judge_models
from stages.rendezvous import FollowerDone
from stages.resume import CheckpointRejected, attempts, forget, resumable
from stages.tracking import RetryingClient, StageRun

_IN_MEMORY = dict(cache_policy=NO_CACHE, persist_result=False, log_prints=False)


def _phase_task(phase: str):
    @task(name=phase, **_IN_MEMORY)
    def run_phase(fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    return run_phase


PHASE_TASKS = {phase: _phase_task(phase) for phase in PHASES}
LOOP_TASKS = frozenset(PHASE_TASKS)


class QuietLoopTasks(logging.Filter):
    """Drops the records below WARNING that Prefect's task engine logs for the loop's four tasks ("Finished in state
    Completed()", four per iteration); the task runs still reach the server, and a failed task still logs its error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or getattr(record, "task_name", None) not in LOOP_TASKS


_QUIET = QuietLoopTasks()


def quiet_loop_task_logs() -> None:
    """Attach `QuietLoopTasks` to Prefect's task-run logger (idempotent; re-attached if Prefect reset it)."""
    logger = logging.getLogger("prefect.task_runs")
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)


def as_task(phase: str, fn: Callable[..., Any], *args: Any) -> Any:
    """The loop's `call`: run a phase as its Prefect task."""
    quiet_loop_task_logs()
    return PHASE_TASKS[phase](fn, *args)


def submit_task(phase: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`as_task.submit`: submit a phase as its Prefect task to the flow's task runner (threads) and return its
    future: async rollouts (`ppo.async_rollouts`) submit the next rollout task before this iteration's update task."""
    quiet_loop_task_logs()
    return PHASE_TASKS[phase].submit(fn, *args)


as_task.submit = submit_task  # type: ignore[attr-defined]


def _conversations(data_dir: Path, cfg: PipelineConfig, has_rm: bool, prompts: list[str]) -> dict[str, Any]:
    """The messages of PPO's prompts, for an RM with a base model of its own (`stages.data.conversations`)."""
    table = conversations(data_dir, has_rm and bool(cfg.reward.name_or_path))
    return {p: table[p] for p in prompts if p in table}


@dataclass(frozen=True)
class PPOInputs(StageInputs):
    """The PPO stage's resolved inputs: the data (its folder and stage result, the task whose gold judge monitors),
    each `kind: judge` reward source's local folder and identity, and the SFT and reward models (`models`)."""

    data_dir: Path = Path()
    data: StageResult | None = None
    task: str = ""
    judges: Mapping[str, str] = field(default_factory=dict)
    judge_ids: Mapping[str, str] = field(default_factory=dict)
    rm_alarm: str | None = None  # the reward run's rm_no_edge alarm (`rm_edge`), a warning


def resolve_ppo(config: PipelineConfig, data: StageResult, sft: StageResult, reward: StageResult | None) -> PPOInputs:
    """The PPO stage's one resolution step: the RM's edge check (`rm_edge`: refused here under
    `ppo.require_rm_edge`), the data artifact, the key's parts (PPO's keys, the reward functions' and the
    environment's code, the judges' weights), the judges' folders, the memory plan."""
    rm_alarm = rm_edge(config, reward) if reward is not None else None
    data_dir = download(data.artifact_uri, data.digest)
    # Besides PPO's own keys, what changes its numbers: the prompt budget and the models' precision.
    section = {"ppo": config.ppo.key(), "model": {"n_positions": config.model.n_positions, "dtype": config.model.dtype},
               "resources": {"mixed_precision": config.resources.mixed_precision,
                             "frozen_dtype": config.resources.frozen_dtype}}
    if config.ppo.ptx_coef > 0:  # the demonstrations' length
        section["sft"] = {"max_length": config.sft.max_length}
    if code := reward_code(config.ppo.rewards):
        section["reward_code"] = code
    if config.ppo.environment:  # an edited environment reruns PPO
        section["environment_code"] = environment_digest(config.ppo.environment)
    # The held-out prompts are an input only when PPO evaluates on them (ppo.eval_every).
    fingerprint = file_digest(data_dir, "prompts_train") + (file_digest(data_dir, "prompts_eval")
                                                            if config.ppo.eval_every else "")
    if reward is not None and config.reward.name_or_path:  # the RM renders the conversations with its own template
        fingerprint += conversations_digest(data_dir)
    judges, judge_ids = judge_models(config.ppo.rewards)  # refused here, before any work, if one cannot load
    if judge_ids:  # the judges' weights: a new judge behind the same name reruns PPO
        section["judges"] = judge_ids
    upstream = {"sft": sft} | ({"reward": reward} if reward is not None else {})
    return PPOInputs(frozen(section), frozen(upstream), fingerprint, frozen(upstream), memory_check(config, "ppo"),
                     data_dir=data_dir, data=data, task=data_task(data_dir).name, judges=frozen(judges),
                     judge_ids=frozen(judge_ids), rm_alarm=rm_alarm)


def _build(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path, inputs: PPOInputs, dirs: Mapping[str, Path]) -> None:
        data_dir, data, judges, judge_ids = inputs.data_dir, inputs.data, inputs.judges, inputs.judge_ids
        if judge_ids:  # lineage: which judge graded the replies
            run.set_tags({f"rlhf.judge.{name}": f"{next(s.model for s in cfg.ppo.rewards if s.name == name)} "
                          f"({ident})" for name, ident in judge_ids.items()})
        inputs.memory.enforce()  # refuse a stage that cannot fit the device before anything loads
        r = cfg.resources  # before any model is loaded or process launched; the batch is split over every node's
        check_sizes(cfg.ppo, r.num_processes * r.num_machines)
        sft_dir, reward_dir = dirs["sft"], dirs.get("reward")  # fetched after the look-up: a hit downloads none
        prompts = [p.prompt for p in read_prompts(data_dir / FILE_NAMES["prompts_train"]).rows]
        ptx = ([(e.prompt, e.response) for e in read_sft(data_dir / FILE_NAMES["sft"]).rows]
               if cfg.ppo.ptx_coef > 0 else [])
        log_dataset(run, [{"prompt": p} for p in prompts], f"{data.artifact_uri}/{FILE_NAMES['prompts_train']}",
                    dataset_name(data_dir, "prompts_train"), "training", file_digest(data_dir, "prompts_train"))
        tokenizer = load_tokenizer(sft_dir, trust_remote_code=cfg.model.trust_remote_code)
        max_prompt = cfg.model.n_positions - cfg.ppo.response_tokens
        run.log_metrics({"ppo/truncated_prompts": prompt_truncations(tokenizer, prompts, max_prompt)}, step=0)
        heldout = ([p.prompt for p in read_prompts(data_dir / FILE_NAMES["prompts_eval"]).rows]
                   if cfg.ppo.eval_every else [])
        # The launch boundary (docs/architecture.md): everything the loop needs, as JSON, because a launched run reads
        # it from a file in each of its processes. The config crosses as its JSON dump and is validated once on the
        # other side (`PPOJob.cfg`); models cross as directories, prompts and columns as plain lists and dicts.
        # The job's own copy keeps what redaction would hide (a literal key in a reward URL): it never leaves us.
        job = PPOJob(config=cfg.model_dump(mode="json", context={KEEP_SECRETS: True}), sft_dir=str(sft_dir),
                     reward_dir=str(reward_dir) if reward_dir else None, prompts=prompts, out_dir=str(out_dir), ptx=ptx,
                     task=inputs.task, eval_prompts=heldout,
                     columns=prompt_columns(data_dir, "prompts_train", "prompts_eval"),
                     conversations=_conversations(data_dir, cfg, reward_dir is not None, prompts + heldout),
                     judges=dict(judges or {}))
        _train(cfg, run, job)
    return build


def _train(cfg: PipelineConfig, run: StageRun | FollowerRun, job: PPOJob) -> None:
    """The loop, resumed from the newest complete checkpoint of an interrupted run with this key if there is one: only
    that one is downloaded, and the one before it only if it does not load (`stages.resume.attempts`).

    Across nodes the loop starts afresh: every node would have to load the same checkpoint, and which one node 0
    takes is known only once it has tried them. A node with machine_rank > 0 stops after its launch
    (`FollowerDone`)."""
    r = cfg.resources
    found = resumable(run, pending_key(run)) if r.num_machines == 1 else None
    try:
        for ckpt in attempts(run, found):
            job.resume = [str(ckpt)] if ckpt else []
            sink = PPORunSink(run, cfg.ppo.iterations, found.run_id if found else None, cfg.ppo.keep_checkpoints)
            try:
                with tempfile.TemporaryDirectory(prefix="rlhf-ppo-") as tmp:
                    if r.num_processes > 1 or r.num_machines > 1:
                        launch_task(job, cfg, sink, Path(tmp), launch_id_of(run))
                        if r.machine_rank > 0:
                            raise FollowerDone(f"ppo: machine_rank {r.machine_rank} trained with node 0, which "
                                               "saves the policy")
                    else:
                        train_ppo(job, sink, Path(tmp), call=as_task)
                    sink.close()
                return
            except CheckpointRejected:
                get_run_logger().warning("ppo: checkpoint %s did not load; trying the one before it", ckpt.name)
    finally:
        forget(found)


@task(name="ppo-launch", **_IN_MEMORY)
def launch_task(job: PPOJob, cfg: PipelineConfig, sink: PPORunSink, workdir: Path,
                launch_id: str = "") -> None:
    """The whole PPO loop in `resources.num_processes` processes under `accelerate launch`: one task, since the
    per-phase tasks cannot span processes. PPO's processes are DDP processes (NCCL on GPUs, gloo on CPUs) whatever
    `resources.accelerate_config` says for SFT and RM (PPO keeps a full copy of every model per process). Its
    autocast is its own (`resources.mixed_precision`, around the forward passes of every phase), not
    Accelerate's, so that the rollout's log-probs and the update's come from the same numerics."""
    resources = cfg.resources.model_copy(update={"accelerate_config": default_config(cfg.resources.device)})
    run_job(launched, job.to_dict(), resources, workdir, sink, cfg.torch_threads, mixed_precision="no",
            launch_id=launch_id)


def rm_edge(cfg: PipelineConfig, reward: StageResult) -> str | None:
    """The reward run's alarm `rm_no_edge` (the RM does not beat the policy's zero-shot log-likelihood on its
    held-out pairs: `rlhf_lib.baselines`), read before PPO starts. With `ppo.require_rm_edge` PPO is refused: when
    the alarm is there, and when the reward run has no baseline figures to judge by (reward.baselines off, or a
    model from elsewhere). Returns the alarm's text (a warning), or None."""
    tags, metrics = {}, {}
    if reward.mlflow_run_id:
        data = RetryingClient().get_run(reward.mlflow_run_id).data
        tags, metrics = data.tags, data.metrics
    alarm = tags.get("rlhf.alarm.rm_no_edge")
    where = f"reward run {reward.mlflow_run_id or '(none)'} ({reward.source or reward.model_uri or 'this pipeline'})"
    if cfg.ppo.require_rm_edge:
        if alarm:
            raise ValueError(f"ppo.require_rm_edge: {alarm} ({where}); PPO would optimise a reward that ranks no "
                             "better than what the policy already prefers")
        if "reward/baseline/loglik_accuracy" not in metrics:
            raise ValueError(f"ppo.require_rm_edge: {where} has no baseline figures to judge the reward model by "
                             "(reward/baseline/loglik_accuracy); train it with reward.baselines=true")
    return alarm


@flow(name="ppo", flow_run_name="ppo-{config.name}")
def ppo_stage(
    config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult, reward: StageResult | None
) -> StageResult:
    """PPO against the frozen reward model and the other reward sources of `ppo.rewards` (`reward` is None when
    no source is a model), as a loop of rollout -> score -> gae -> update tasks."""
    return _ppo(config, ctx, data, sft, reward)


def control_config(config: PipelineConfig, control: str) -> PipelineConfig:
    """The PPO stage's config with its reward replaced by the control arm `control` (`ppo.reward_control`): the same
    settings, seed, shaping and budget otherwise."""
    return config.model_copy(update={"ppo": config.ppo.model_copy(update={"reward_control": control})})


@flow(name="ppo-control", flow_run_name="ppo-{control}-{config.name}")
def ppo_control_stage(
    config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult, reward: StageResult | None,
    control: str,
) -> StageResult:
    """A control arm of the PPO stage (`eval.controls`): PPO with the same settings, seed, SFT model, reward model and
    budget, the reward sources' score replaced by 0 (`zero_reward`) or permuted within each rollout
    (`shuffled_reward`). Cached like the PPO stage (its key differs by `ppo.reward_control`), its own MLflow run
    (`ppo-<control>-<key>`, tag `rlhf.variant`), never registered as an `rlhf-policy` version."""
    return _ppo(control_config(config, control), ctx, data, sft, reward, variant=control)


def _ppo(config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult, reward: StageResult | None,
         variant: str | None = None) -> StageResult:
    ctx = on_node(ctx, config.resources)  # this node's role in a multi-node run (stages.follower.follow)
    inputs = resolve_ppo(config, data, sft, reward)
    if inputs.rm_alarm:
        get_run_logger().warning("ppo: the reward stage raised alarm rm_no_edge: %s", inputs.rm_alarm)
    result, _ = run_stage(ctx, "ppo", inputs, _build(config), variant=variant)
    return as_state(result)
