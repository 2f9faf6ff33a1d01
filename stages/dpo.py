"""DPO stage: the SFT model trained on the preference pairs directly (`rlhf_lib.dpo`), a branch of the DAG beside the
reward model and PPO (data -> sft -> dpo). Its figure is the held-out accuracy of its implicit reward on the pairs the
reward model's report uses; the trained policy is registered as `rlhf-dpo`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prefect import flow

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_pairs, read_ranked
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.collate import truncation_counts, truncation_notice
from rlhf_lib.devices import autocast, resolve_device, weights_dtype
from rlhf_lib.dpo import encode_pairs, heldout_metrics, launched, pair_logps, preference_pairs, train_dpo
from rlhf_lib.model_dirs import load_causal_lm, save_model
from rlhf_lib.models import build_policy, fit_length
from rlhf_lib.training import n_batches
from stages.artifact_cache import download
from stages.base import RunSink, as_state, log_dataset, warn
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.data import dataset_name, file_digest
from stages.follower import launch_id_of
from stages.inputs import StageInputs, frozen, memory_check, run_stage
from stages.supervised import Loop, numerics_section, train_supervised
from stages.tracking import StageRun

# The trained policy loads back as a causal LM with the SFT model's tokenizer.
DPO_LOOP = Loop(train_dpo, launched, lambda path, tok: build_policy(tok, str(path)))


@dataclass(frozen=True)
class DPOInputs(StageInputs):
    """The DPO stage's resolved inputs: the data (its folder and stage result); the SFT model (`models["sft"]`) is
    both the policy's start and the reference."""

    data_dir: Path = Path()
    data: StageResult | None = None


def resolve_dpo(config: PipelineConfig, data: StageResult, sft: StageResult) -> DPOInputs:
    """The DPO stage's one resolution step: the data artifact, the key's parts, the memory plan."""
    data_dir = download(data.artifact_uri, data.digest)
    fingerprint = file_digest(data_dir, "preferences") + file_digest(data_dir, "eval_pairs")
    # The SFT model's digest stands for the model; its dtype and remote code are how it is loaded here.
    section = {"dpo": config.dpo.key(), "model": {"dtype": config.model.dtype,
                                                  "trust_remote_code": config.model.trust_remote_code},
               **numerics_section(config.resources)}
    return DPOInputs(frozen(section), frozen({"sft": sft}), fingerprint, frozen({"sft": sft}),
                     memory_check(config, "dpo"), data_dir=data_dir, data=data)


def _build(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path, inputs: DPOInputs, dirs: Mapping[str, Path]) -> None:
        inputs.memory.enforce()  # refuse a stage that cannot fit the device before anything loads
        data_dir, data, sft_dir = inputs.data_dir, inputs.data, dirs["sft"]  # fetched after the look-up
        model, tokenizer = load_causal_lm(sft_dir, cfg.model.trust_remote_code, weights_dtype(cfg.model.dtype))
        examples = read_ranked(data_dir / FILE_NAMES["preferences"]).rows
        log_dataset(run, [{"prompt": e.prompt, "responses_best_first": list(e.responses)} for e in examples],
                    f"{data.artifact_uri}/{FILE_NAMES['preferences']}", dataset_name(data_dir, "preferences"),
                    "training", file_digest(data_dir, "preferences"))
        dcfg = cfg.dpo.model_copy(update={"max_length": fit_length(cfg.dpo.max_length, model)})
        pairs = preference_pairs(examples)
        cut = truncation_counts(tokenizer, [p.prompt for p in pairs for _ in (0, 1)],
                                [r for p in pairs for r in (p.chosen, p.rejected)], dcfg.max_length)
        run.log_metrics({"dpo/truncated_prompts": cut["prompts"], "dpo/truncated_responses": cut["responses"]}, 0)
        if (notice := truncation_notice("dpo", cut, 2 * len(pairs), "dpo.max_length", dcfg.max_length)) is not None:
            warn(notice)
        # The held-out pairs of the reward model's report, scored by the reference (the SFT model) before training.
        device = resolve_device(cfg.resources.device)
        heldout = encode_pairs(tokenizer, read_pairs(data_dir / FILE_NAMES["eval_pairs"]).rows, dcfg.max_length)
        precision = autocast(device, cfg.resources.mixed_precision)
        with precision():
            reference = pair_logps(model.to(device), heldout, tokenizer.pad_token_id, dcfg.eval_batch_size, device)
        model, final = train_supervised("dpo", DPO_LOOP, cfg.resources, model, tokenizer, examples, dcfg,
                                        RunSink(run, n_batches(len(pairs), dcfg.batch_size, dcfg.epochs,
                                                               dcfg.max_steps)),
                                        cfg.torch_threads, launch_id_of(run))
        with precision():
            policy = pair_logps(model.to(device), heldout, tokenizer.pad_token_id, dcfg.eval_batch_size, device)
        final.update(heldout_metrics(policy, reference, dcfg.beta))
        run.log_metrics(final, step=0)
        save_model(model, tokenizer, out_dir)
    return build


@flow(name="dpo", flow_run_name="dpo-{config.name}")
def dpo_stage(config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult) -> StageResult:
    """Train the SFT model with DPO on the preference pairs; report its implicit reward's held-out accuracy."""
    ctx = on_node(ctx, config.resources)  # this node's role in a multi-node run (stages.follower.follow)
    result, _ = run_stage(ctx, "dpo", resolve_dpo(config, data, sft), _build(config))
    return as_state(result)
