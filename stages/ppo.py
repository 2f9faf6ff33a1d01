"""PPO stage: a Prefect sub-flow that loops the tasks rollout -> score -> gae -> update once per iteration.

The tasks share one in-memory `PPOTrainer` (models, optimizer, KL controller) and hand the `Rollout` tensors to
each other directly: caching is off and nothing is persisted, so a task call costs milliseconds, and no model or
tensor is ever JSON-encoded as a flow parameter.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_prompts, read_sft
from rlhf_lib.data.collate import prompt_truncations
from rlhf_lib.demo_task import FILE_NAMES, gold_score
from rlhf_lib.models import build_scalar_model
from rlhf_lib.ppo.alarms import AlarmMonitor
from rlhf_lib.ppo.checkpoint import checkpoint_dir, save_checkpoint
from rlhf_lib.ppo.rollout import decode_responses
from rlhf_lib.ppo.trainer import PPOModels, PPOTrainer
from rlhf_lib.ppo.types import Rollout
from stages.base import RunContext, as_state, log_dataset, run_cached
from stages.cache import StageResult
from stages.data import file_digest, has_judge
from stages.models_io import load_causal_lm, load_reward_side, save_model
from stages.resume import COMPLETE_MARKER, resume
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


def iteration_tasks(trainer: PPOTrainer) -> tuple[Rollout, dict[str, float]]:
    """One PPO iteration as the sub-flow's four tasks: rollout -> score -> gae -> update."""
    ro = score_task(trainer, rollout_task(trainer))
    stats = gae_task(trainer, ro)
    stats.update(update_task(trainer, ro))
    return ro, stats


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


def _build(cfg: PipelineConfig, data_dir: Path, data: StageResult, sft_dir: Path, reward_dir: Path):
    def build(run: StageRun, out_dir: Path) -> None:
        models = load_models(cfg, sft_dir, reward_dir)
        prompts = [p.prompt for p in read_prompts(data_dir / FILE_NAMES["prompts_train"]).rows]
        ptx = ([(e.prompt, e.response) for e in read_sft(data_dir / FILE_NAMES["sft"]).rows]
               if cfg.ppo.ptx_coef > 0 else [])
        log_dataset(run, [{"prompt": p} for p in prompts], f"{data.artifact_uri}/{FILE_NAMES['prompts_train']}",
                    "demo-prompts-train", "training", file_digest(data_dir, "prompts_train"))
        max_prompt = cfg.model.n_positions - cfg.ppo.max_new_tokens
        run.log_metrics({"ppo/truncated_prompts": prompt_truncations(models.tokenizer, prompts, max_prompt)}, step=0)
        trainer = PPOTrainer(models, prompts, cfg.ppo, max_prompt_tokens=max_prompt, ptx_examples=ptx,
                             ptx_max_length=cfg.sft.max_length)
        start = resume(trainer, run, run.run.info.experiment_id, run.run.data.tags["rlhf.cache_key_pending"])
        if start:
            get_run_logger().info("ppo: resumed an interrupted run at iteration %d", start)
            trainer.sync_engine()
        judge = gold_score if has_judge(data_dir) else None
        try:
            ppo_loop(trainer, run, cfg.ppo.iterations, judge)
        finally:
            if trainer.engine is not None:
                trainer.engine.close()
        save_model(trainer.export_policy(), models.tokenizer, out_dir)
    return build


def log_checkpoint(trainer: PPOTrainer, run: StageRun) -> None:
    """Save the trainer's whole state (no pickle) and log it to the PPO run as `checkpoints/iter_NNNNNN/`."""
    with tempfile.TemporaryDirectory(prefix="rlhf-ckpt-") as tmp:
        path = save_checkpoint(trainer, checkpoint_dir(Path(tmp), trainer.iteration))
        run.log_dir(path, f"checkpoints/{path.name}")
        # Logged last: a process killed while the files were being copied leaves no marker, and resume skips it.
        run.log_text(path.name, f"checkpoints/{path.name}/{COMPLETE_MARKER}")


def ppo_loop(trainer: PPOTrainer, run: StageRun, iterations: int, judge=None) -> None:
    """The loop of the PPO sub-flow: one rollout -> score -> gae -> update chain of tasks per iteration, with the
    metrics of each iteration logged to MLflow. The gold judge (demo task only) scores logged samples, never
    the policy's reward. Alarms go to the Prefect log as warnings and to the run as `rlhf.alarm.<name>` tags."""
    monitor, raised = AlarmMonitor(trainer.cfg), set()
    for it in range(trainer.iteration, iterations):  # a resumed trainer continues where its checkpoint left off
        ro, stats = iteration_tasks(trainer)
        if judge is not None:  # monitoring only: the gold judge never enters the reward
            texts = decode_responses(trainer.m.tokenizer, ro.response, ro.response_mask)
            gold = [judge(p, t) for p, t in zip(ro.prompts, texts)]
            stats["objective/gold"] = sum(gold) / len(gold)
        if it % trainer.cfg.sample_every == 0 or it == iterations - 1:
            rows = trainer.samples(ro, 8)
            if judge is not None:
                for r, g in zip(rows, gold):
                    r["gold"] = g
            run.log_table(rows, f"samples/iter_{it:04d}.json")
        run.log_metrics(stats, step=it)
        alarms = monitor.check(it, stats)
        for alarm in alarms:
            get_run_logger().warning("PPO alarm %s at %s", alarm.name, alarm)
            if alarm.name not in raised:  # the tag keeps the first occurrence; the log has every one
                run.set_tags({f"rlhf.alarm.{alarm.name}": str(alarm)})
                raised.add(alarm.name)
        stopping = bool(alarms) and trainer.cfg.stop_on_alarm
        healthy = not any(a.name == "nan" for a in alarms)  # a non-finite state is never checkpointed
        if healthy and ((it + 1) % trainer.cfg.checkpoint_every == 0 or it == iterations - 1 or stopping):
            log_checkpoint(trainer, run)
        if stopping:
            run.set_tags({"rlhf.stopped_on_alarm": f"iteration {it}: {', '.join(a.name for a in alarms)}"})
            return


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
