"""SFT stage: train the tokenizer and the policy's starting point on the demonstrations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from prefect import flow

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_ranked, read_sft
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.collate import truncation_counts, truncation_notice
from rlhf_lib.devices import weights_dtype
from rlhf_lib.model_dirs import save_model
from rlhf_lib.models import (
    build_policy,
    count_parameters,
    fit_length,
    load_tokenizer,
    train_tokenizer,
)
from rlhf_lib.sft import launched, train_sft
from rlhf_lib.training import n_batches
from stages.artifact_cache import download
from stages.base import RunSink, as_state, log_dataset, warn
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.data import data_task, dataset_name, file_digest
from stages.follower import launch_id_of
from stages.inputs import StageInputs, frozen, memory_check, run_stage
from stages.models_io import base_model_tags, local_model, model_source_digest
from stages.supervised import Loop, numerics_section, train_supervised
from stages.tracking import StageRun

# The trained policy loads back as a causal LM with the stage's tokenizer.
SFT_LOOP = Loop(train_sft, launched, lambda path, tok: build_policy(tok, str(path)))


def tokenizer_corpus(data_dir: Path):
    """Every training text of the task (prompts, demonstrations and ranked responses), none of the held-out
    files: the tokenizer is fitted like the models, so eval prompts are encoded as unseen text would be."""
    for ex in read_sft(data_dir / FILE_NAMES["sft"]).rows:
        yield ex.prompt + ex.response
    for ex in read_ranked(data_dir / FILE_NAMES["preferences"]).rows:
        yield from (ex.prompt + r for r in ex.responses)


@dataclass(frozen=True)
class SFTInputs(StageInputs):
    """The SFT stage's resolved inputs: the data (its folder, its stage result, its task) and the base model's local
    folder (`model.name_or_path`, imported if a .gguf or known name; None: a model built here)."""

    data_dir: Path = Path()
    data: StageResult | None = None
    split_digits: bool = False
    base_model: str | None = None


def resolve_sft(config: PipelineConfig, data: StageResult) -> SFTInputs:
    """The SFT stage's one resolution step: the data artifact, the key's parts, the base model's folder, the memory
    plan."""
    m = config.model
    data_dir = download(data.artifact_uri, data.digest)
    section = {"model": config.model.model_dump(), "sft": config.sft.model_dump(), **numerics_section(config.resources)}
    # A fresh tokenizer is trained on these two files (`tokenizer_corpus`: no held-out file), the model on the
    # first; a local pretrained model counts by its content.
    fingerprint = "".join(file_digest(data_dir, k) for k in ("sft", "preferences"))
    fingerprint += model_source_digest(m.name_or_path, m.revision)
    return SFTInputs(frozen(section), frozen({}), fingerprint, memory=memory_check(config, "sft"), data_dir=data_dir,
                     data=data, split_digits=data_task(data_dir).split_digits,
                     base_model=local_model(m.name_or_path, m.revision) if m.name_or_path else None)


def _build(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path, inputs: SFTInputs, dirs: Mapping[str, Path]) -> None:
        inputs.memory.enforce()  # refuse a stage that cannot fit the device before anything loads
        data_dir, data = inputs.data_dir, inputs.data
        torch.manual_seed(cfg.model.seed)
        m = cfg.model
        source = inputs.base_model
        if source:
            run.set_tags(base_model_tags(m.name_or_path, source, run))
            tokenizer = load_tokenizer(source, m.revision, m.trust_remote_code)
        else:
            tokenizer = train_tokenizer(tokenizer_corpus(data_dir), m.vocab_size,
                                        split_digits=inputs.split_digits)
        model = build_policy(tokenizer, source, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                             n_positions=m.n_positions, seed=m.seed, revision=m.revision,
                             trust_remote_code=m.trust_remote_code, dtype=weights_dtype(m.dtype))
        examples = read_sft(data_dir / FILE_NAMES["sft"]).rows
        log_dataset(run, [e.__dict__ for e in examples], f"{data.artifact_uri}/{FILE_NAMES['sft']}",
                    dataset_name(data_dir, "sft"), "training", file_digest(data_dir, "sft"))
        run.log_params({"model.parameters": count_parameters(model), "model.vocab": len(tokenizer)})
        sft_cfg = cfg.sft.model_copy(update={"max_length": fit_length(min(cfg.sft.max_length, m.n_positions), model)})
        cut = truncation_counts(tokenizer, [e.prompt for e in examples], [e.response for e in examples],
                                sft_cfg.max_length)
        run.log_metrics({"sft/truncated_prompts": cut["prompts"], "sft/truncated_responses": cut["responses"]}, 0)
        if (notice := truncation_notice("sft", cut, len(examples), "sft.max_length", sft_cfg.max_length)) is not None:
            warn(notice)
        if sft_cfg.max_steps == 0:  # the pretrained model itself, saved as the stage's model (lineage, tags)
            run.log_metrics({"sft/steps": 0.0}, step=0)
            save_model(model, tokenizer, out_dir)
            return
        model, final = train_supervised("sft", SFT_LOOP, cfg.resources, model, tokenizer, examples, sft_cfg,
                                        RunSink(run, n_batches(len(examples), sft_cfg.batch_size, sft_cfg.epochs,
                                                               sft_cfg.max_steps)),
                                        cfg.torch_threads, launch_id_of(run))
        run.log_metrics(final, step=0)
        save_model(model, tokenizer, out_dir)
    return build


@flow(name="sft", flow_run_name="sft-{config.name}")
def sft_stage(config: PipelineConfig, ctx: RunContext, data: StageResult) -> StageResult:
    """Supervised fine-tuning on the demonstrations (loss on response tokens only)."""
    ctx = on_node(ctx, config.resources)  # this node's role in a multi-node run (stages.follower.follow)
    result, _ = run_stage(ctx, "sft", resolve_sft(config, data), _build(config))
    return as_state(result)
