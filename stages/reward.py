"""Reward-model stage: Bradley-Terry over every pair of each ranked list, initialised from the SFT model."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_pairs, read_ranked
from rlhf_lib.demo_task import FILE_NAMES
from rlhf_lib.models import build_policy, build_scalar_model
from rlhf_lib.reward import pairwise_accuracy
from stages.base import RunContext, as_state, log_dataset, run_cached
from stages.cache import StageResult
from stages.data import file_digest
from stages.launch import numerics_section, train_supervised
from stages.models_io import fit_length, load_causal_lm, save_model
from stages.tracking import StageRun, download


def _build(cfg: PipelineConfig, data_dir: Path, data: StageResult, sft_dir: Path):
    def build(run: StageRun, out_dir: Path) -> None:
        sft_model, tokenizer = load_causal_lm(sft_dir)
        if not cfg.reward.init_from_sft:
            m = cfg.model
            sft_model = build_policy(tokenizer, None, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                                     n_positions=m.n_positions, seed=cfg.reward.seed)
        model = build_scalar_model(sft_model, seed=cfg.reward.seed)
        del sft_model
        examples = read_ranked(data_dir / FILE_NAMES["preferences"]).rows
        log_dataset(run, [{"prompt": e.prompt, "responses_best_first": list(e.responses)} for e in examples],
                    f"{data.artifact_uri}/{FILE_NAMES['preferences']}", "demo-preferences", "training",
                    file_digest(data_dir, "preferences"))
        rcfg = cfg.reward.model_copy(update={"max_length": fit_length(cfg.reward.max_length, model)})
        model, final = train_supervised("reward", cfg.resources, model, tokenizer, examples, rcfg,
                                        lambda step, mets: run.log_metrics(mets, step), cfg.torch_threads)
        pairs = read_pairs(data_dir / FILE_NAMES["eval_pairs"]).rows
        final["reward/heldout_accuracy"] = pairwise_accuracy(model, tokenizer, pairs, rcfg.max_length)
        run.log_metrics(final, step=0)
        save_model(model, tokenizer, out_dir)
    return build


@flow(name="reward", flow_run_name="reward-{config.name}")
def reward_stage(config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult) -> StageResult:
    """Train the reward model on ranked lists; report pairwise accuracy on noise-free held-out pairs."""
    data_dir = download(data.artifact_uri)
    sft_dir = download(sft.artifact_uri)
    fingerprint = file_digest(data_dir, "preferences") + file_digest(data_dir, "eval_pairs")
    # The model sizes matter when the RM does not start from the SFT model (init_from_sft=false).
    section = {"reward": config.reward.model_dump(), "model": config.model.model_dump(),
               **numerics_section(config.resources)}
    result, _ = run_cached(ctx, "reward", section, {"sft": sft}, fingerprint, _build(config, data_dir, data, sft_dir))
    return as_state(result)
