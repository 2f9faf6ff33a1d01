"""Reward-model stage: Bradley-Terry over every pair of each ranked list, initialised from the SFT model (or from
`reward.name_or_path`, a pretrained base with its own tokenizer)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_ranked
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.collate import truncation_counts, truncation_notice
from rlhf_lib.data.conversations import rendered_ranked
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.model_dirs import save_model
from rlhf_lib.models import build_scalar_model, fit_length
from rlhf_lib.reward import launched, train_reward_model
from rlhf_lib.training import n_batches
from stages.artifact_cache import download
from stages.base import RunSink, as_state, log_dataset, warn
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.data import conversations_digest, dataset_name, file_digest, optional_digest
from stages.follower import launch_id_of
from stages.inputs import StageInputs, frozen, memory_check, run_stage
from stages.models_io import model_source_digest
from stages.reward_heldout import heldout_report, no_edge_alarm
from stages.reward_models import build_reward, own_rendering, reward_base
from stages.supervised import Loop, numerics_section, train_supervised
from stages.tracking import StageRun

REWARD_LOOP = Loop(train_reward_model, launched, lambda path, tok: build_scalar_model(path))


@dataclass(frozen=True)
class RewardInputs(StageInputs):
    """The reward stage's resolved inputs: the data (its folder and stage result) and the RM's own base model's
    folder (`reward.name_or_path`; None: it starts from the SFT model, `models["sft"]`)."""

    data_dir: Path = Path()
    data: StageResult | None = None
    base_model: str | None = None


def resolve_reward(config: PipelineConfig, data: StageResult, sft: StageResult) -> RewardInputs:
    """The reward stage's one resolution step: the data artifact, the key's parts, the RM's base model's folder, the
    memory plan. The SFT model is read in any case (the log-likelihood baseline reads the policy's text with it)."""
    data_dir = download(data.artifact_uri, data.digest)
    fingerprint = file_digest(data_dir, "preferences") + file_digest(data_dir, "eval_pairs")
    fingerprint += optional_digest(data_dir, "adversarial_pairs")
    fingerprint += model_source_digest(config.reward.name_or_path, config.reward.revision)
    if config.reward.name_or_path:  # its own template renders the conversations where the policy's tokenizer differs
        fingerprint += conversations_digest(data_dir) + model_source_digest(config.model.name_or_path,
                                                                            config.model.revision)
    # The model sizes matter when the RM does not start from the SFT model (init_from_sft=false); an RM from its own
    # base model does not depend on SFT at all.
    section = {"reward": config.reward.model_dump(), "model": config.model.model_dump(),
               **numerics_section(config.resources)}
    upstream = {} if config.reward.name_or_path else {"sft": sft}  # the lineage: what the RM was trained from
    if config.reward.name_or_path and config.reward.baselines:
        # Not from the SFT model, but its log-likelihood baseline (and the rm_no_edge alarm) reads it: a new SFT
        # model is a new key, without tagging the RM as trained from it.
        fingerprint += sft.digest
    return RewardInputs(frozen(section), frozen(upstream), fingerprint, frozen({"sft": sft}),
                        memory_check(config, "reward"), data_dir=data_dir, data=data, base_model=reward_base(config))


def _build(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path, inputs: RewardInputs, dirs: Mapping[str, Path]) -> None:
        inputs.memory.enforce()  # refuse a stage that cannot fit the device before anything loads
        data_dir, data, sft_dir = inputs.data_dir, inputs.data, dirs["sft"]
        model, tokenizer = build_reward(cfg, sft_dir, inputs.base_model, run)
        rendering = own_rendering(cfg, data_dir, sft_dir, tokenizer)
        run.set_tags({"rlhf.reward.rendering": "policy" if rendering is None
                      else "own chat template" if rendering.templated else "own hh text"})
        examples = rendered_ranked(read_ranked(data_dir / FILE_NAMES["preferences"]).rows, rendering)
        log_dataset(run, [{"prompt": e.prompt, "responses_best_first": list(e.responses)} for e in examples],
                    f"{data.artifact_uri}/{FILE_NAMES['preferences']}", dataset_name(data_dir, "preferences"),
                    "training", file_digest(data_dir, "preferences"))
        rcfg = cfg.reward.model_copy(update={"max_length": fit_length(cfg.reward.max_length, model)})
        cut = truncation_counts(tokenizer, [e.prompt for e in examples for _ in e.responses],
                                [r for e in examples for r in e.responses], rcfg.max_length)
        run.log_metrics({"reward/truncated_prompts": cut["prompts"], "reward/truncated_responses": cut["responses"]},
                        step=0)
        rows = sum(len(e.responses) for e in examples)
        if (notice := truncation_notice("reward", cut, rows, "reward.max_length", rcfg.max_length)) is not None:
            warn(notice)
        model, final = train_supervised("reward", REWARD_LOOP, cfg.resources, model, tokenizer, examples, rcfg,
                                        RunSink(run, n_batches(len(examples), rcfg.batch_size, rcfg.epochs,
                                                               rcfg.max_steps)),
                                        cfg.torch_threads, launch_id_of(run))
        device = ProcessGroup(device=cfg.resources.device).device
        metrics, report, html = heldout_report(cfg, data_dir, sft_dir, model.to(device), tokenizer, rendering,
                                               examples, device, inputs.base_model)
        final.update(metrics)
        if alarm := no_edge_alarm(report):
            get_run_logger().warning("reward: alarm rm_no_edge: %s", alarm)
            run.set_tags({"rlhf.alarm.rm_no_edge": alarm})
        run.log_metrics(final, step=0)
        with tempfile.TemporaryDirectory(prefix="rlhf-rm-report-") as tmp:
            (Path(tmp) / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
            (Path(tmp) / "report.html").write_text(html, encoding="utf-8")
            run.log_dir(Path(tmp), "rm_report")
        save_model(model, tokenizer, out_dir)
    return build


@flow(name="reward", flow_run_name="reward-{config.name}")
def reward_stage(config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult) -> StageResult:
    """Train the reward model on ranked lists; report pairwise accuracy on held-out pairs."""
    ctx = on_node(ctx, config.resources)  # this node's role in a multi-node run (stages.follower.follow)
    result, _ = run_stage(ctx, "reward", resolve_reward(config, data, sft), _build(config))
    return as_state(result)
