"""The eval stage's one resolution step (`stages.inputs`): the data artifact and its task, the key's parts (the eval's
keys, the reward sources' and environment's code, the judges' weights, eval.judge's model), the judges' folders,
the memory plan. The eval's build (`stages.eval`) reads the resolved `EvalInputs` only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlhf_lib.config import PipelineConfig
from rlhf_lib.envs import environment_digest
from rlhf_lib.rewards.functions import reward_code
from rlhf_lib.tasks import Task, task_named
from stages.artifact_cache import download
from stages.cache import StageResult
from stages.data import conversations_digest, data_task, file_digest, optional_digest
from stages.eval_judge import eval_judge_model
from stages.inputs import StageInputs, frozen, memory_check
from stages.models_io import judge_models

DPO_ARM = "dpo"  # the DPO policy's arm: its upstream name and the prefix of its figures (dpo_reward_mean, ...)


def control_stage(name: str) -> str:
    """The upstream name of the control arm `name` (`eval.controls`): its PPO run's result, `ppo-<name>`."""
    return f"ppo-{name}"


@dataclass(frozen=True)
class EvalInputs(StageInputs):
    """The eval's resolved inputs: the data (its folder, stage result and task), each `kind: judge` reward source's
    local folder, eval.judge's model folder (None: a function, an endpoint, or no eval.judge); every upstream model is
    read (`models` = `upstream`)."""

    data_dir: Path = Path()
    data: StageResult | None = None
    task: Task = field(default_factory=lambda: task_named("demo"))
    judges: Mapping[str, str] = field(default_factory=dict)
    eval_judge: str | None = None


def resolve_eval(config: PipelineConfig, data: StageResult, sft: StageResult, reward: StageResult | None,
                 ppo: StageResult, controls: dict[str, StageResult], dpo: StageResult | None) -> EvalInputs:
    data_dir = download(data.artifact_uri, data.digest)
    upstream = {"sft": sft} | ({"reward": reward} if reward is not None else {}) | {"ppo": ppo}
    upstream |= {control_stage(name): controls[name] for name in config.eval.controls}
    if dpo is not None:
        upstream[DPO_ARM] = dpo
    fingerprint = file_digest(data_dir, "prompts_eval") + file_digest(data_dir, "eval_pairs")
    fingerprint += optional_digest(data_dir, "prompts_val")  # the best constant reply is picked on it
    if reward is not None and config.reward.name_or_path:  # the RM renders the conversations with its own template
        fingerprint += conversations_digest(data_dir)
    section = {"eval": config.eval.key(), "model": {"n_positions": config.model.n_positions,
                                                           "dtype": config.model.dtype},
               "reward": {"max_length": config.reward.max_length},
               "resources": {"mixed_precision": config.resources.mixed_precision},
               "rewards": [s.model_dump() for s in config.ppo.rewards],
               "reward_code": reward_code(config.ppo.rewards)}
    if config.ppo.rollout_engine == "compiled":  # the eval samples through it too (float rounding may differ)
        section["rollout_engine"] = "compiled"
    if config.eval.best_of and config.ppo.missing_eos_penalty:  # best-of-n reranks with PPO's shaping
        section["best_of_shaping"] = {"missing_eos_penalty": config.ppo.missing_eos_penalty}
    if config.ppo.environment:  # the eval's episodes run the environment too
        section["environment"] = {"name": config.ppo.environment, "max_turns": config.ppo.max_turns,
                                  "max_episode_tokens": config.ppo.max_episode_tokens,
                                  "code": environment_digest(config.ppo.environment)}
    judges, judge_ids = judge_models(config.ppo.rewards)
    if judge_ids:
        section["judges"] = judge_ids
    eval_judge = None
    if config.eval.judge is not None:  # its model's identity, and a function's source, join the key
        eval_judge, section["eval_judge"] = eval_judge_model(config.eval.judge)
        section["eval_judge_code"] = reward_code([config.eval.judge])
    return EvalInputs(frozen(section), frozen(upstream), fingerprint, frozen(upstream), memory_check(config, "eval"),
                      data_dir=data_dir, data=data, task=data_task(data_dir), judges=frozen(judges),
                      eval_judge=eval_judge)
