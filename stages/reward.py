"""Reward-model stage: Bradley-Terry over every pair of each ranked list, initialised from the SFT model (or from
`reward.name_or_path`, a pretrained base with its own tokenizer)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger

from rlhf_lib.baselines import (
    baseline_metrics,
    baseline_rows,
    edge_verdict,
    linear_probe,
    ngram_model,
    prefer_shorter,
    training_pairs,
    zero_shot_loglik,
)
from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_pairs, read_ranked
from rlhf_lib.data.collate import truncation_counts
from rlhf_lib.data.conversations import RewardRendering, rendered_pairs, rendered_ranked, reward_rendering
from rlhf_lib.demo_task import FILE_NAMES, gold_breakdown
from rlhf_lib.devices import autocast, weights_dtype
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.memory import preflight
from rlhf_lib.model_dirs import load_causal_lm, save_model
from rlhf_lib.models import (
    build_policy,
    build_reward_base,
    build_scalar_model,
    fit_length,
    load_tokenizer,
    same_tokenizer,
)
from rlhf_lib.reward import launched, pair_scores, train_reward_model
from rlhf_lib.reward_report import adversarial_metrics, adversarial_report, rm_report
from rlhf_lib.training import n_batches
from stages.artifact_cache import download
from stages.base import RunSink, as_state, log_dataset, run_cached
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.data import conversations, conversations_digest, dataset_name, file_digest, has_judge, optional_digest
from stages.follower import launch_id_of
from stages.models_io import base_model_tags, local_model, model_source_digest
from stages.rm_report import render_rm_report
from stages.supervised import Loop, numerics_section, train_supervised
from stages.tracking import StageRun

REWARD_LOOP = Loop(train_reward_model, launched, lambda path, tok: build_scalar_model(path))


def build_reward(cfg: PipelineConfig, sft_dir: Path, run: StageRun | None = None):
    """The untrained reward model and its tokenizer: from `reward.name_or_path` (its own tokenizer), from the SFT
    model (InstructGPT), or a fresh model of the policy's sizes (`reward.init_from_sft=false`)."""
    r = cfg.reward
    if r.name_or_path:
        source = local_model(r.name_or_path, r.revision)  # a .gguf or known name: its imported folder
        if run is not None:
            run.set_tags(base_model_tags(r.name_or_path, source, run))
        tokenizer = load_tokenizer(source, r.revision, r.trust_remote_code)
        return build_reward_base(source, tokenizer, r.seed, r.revision, r.trust_remote_code,
                                 weights_dtype(cfg.model.dtype), r.head_init), tokenizer
    sft_model, tokenizer = load_causal_lm(sft_dir, cfg.model.trust_remote_code, weights_dtype(cfg.model.dtype))
    if not r.init_from_sft:
        m = cfg.model
        sft_model = build_policy(tokenizer, None, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                                 n_positions=m.n_positions, seed=r.seed)
    return build_scalar_model(sft_model, seed=r.seed, head_init=r.head_init), tokenizer


def own_rendering(cfg: PipelineConfig, data_dir: Path, sft_dir: Path, tokenizer) -> RewardRendering | None:
    """The RM's own rendering of each prompt (its chat template, `rlhf_lib.data.conversations`) when it has a base
    model of its own whose tokenizer differs from the policy's; None: it reads the policy's text."""
    table = conversations(data_dir, bool(cfg.reward.name_or_path))
    if not table:
        return None
    policy_tokenizer = load_tokenizer(sft_dir, trust_remote_code=cfg.model.trust_remote_code)
    return reward_rendering(table, same_tokenizer(policy_tokenizer, tokenizer), tokenizer, cfg.data.render)


def _baselines(cfg: PipelineConfig, data_dir: Path, sft_dir: Path, train: list, ngram, pairs: list,
               rm_right: np.ndarray, device) -> tuple[list[dict], dict]:
    """The cheap baselines beside the trained RM on its held-out pairs (`rlhf_lib.baselines`), and whether it beats
    the policy's zero-shot log-likelihood. The log-likelihood reads the policy's own text with the SFT model; the
    probe reads the RM's starting point (its base model, frozen) on the pairs as the RM reads them."""
    r = cfg.reward
    precision = autocast(device, cfg.resources.mixed_precision)
    verdicts = [prefer_shorter(pairs), ngram(pairs)]
    policy, policy_tokenizer = load_causal_lm(sft_dir, cfg.model.trust_remote_code, weights_dtype(cfg.model.dtype))
    policy = policy.to(device).eval()
    raw = read_pairs(data_dir / FILE_NAMES["eval_pairs"]).rows  # the same pairs, in the policy's text
    with precision():
        verdicts.append(zero_shot_loglik(policy, policy_tokenizer, raw, fit_length(r.max_length, policy),
                                         batch_size=8))
    del policy
    base, tokenizer = build_reward(cfg, sft_dir)  # the RM before training: its backbone's features
    base = base.to(device).eval()
    with precision():
        verdicts.append(linear_probe(base, tokenizer, train, pairs, fit_length(r.max_length, base),
                                     r.eval_batch_size, r.seed))
    rows = baseline_rows(rm_right, verdicts, r.seed)
    beats, text = edge_verdict(float(rm_right.mean()), rows)
    return rows, {"beats_loglik": beats, "text": text}


def _adversarial(cfg: PipelineConfig, data_dir: Path, model, tokenizer, rendering: RewardRendering | None,
                 ngram, device) -> tuple[dict, dict[str, float]]:
    """The demo task's adversarial minimal pairs (`adversarial_pairs.jsonl`): accuracy by kind and by topic pair
    (`rlhf_lib.reward_report.adversarial_report`), with prefer-shorter and the n-gram regression on the same pairs
    (`ngram`: fit on the training pairs) when `reward.baselines` is on. ({}, {}) for data without them."""
    if not optional_digest(data_dir, "adversarial_pairs"):
        return {}, {}
    r = cfg.reward
    pairs = rendered_pairs(read_pairs(data_dir / FILE_NAMES["adversarial_pairs"]).rows, rendering)
    with autocast(device, cfg.resources.mixed_precision)():
        chosen, rejected = pair_scores(model, tokenizer, pairs, fit_length(r.max_length, model), r.eval_batch_size,
                                       r.share_prompts)
    report = adversarial_report(pairs, (chosen > rejected).tolist())
    metrics = adversarial_metrics(report)
    if ngram is not None:
        report["baselines"] = []
        for v in (prefer_shorter(pairs), ngram(pairs)):
            base = adversarial_report(pairs, v.right.tolist())
            report["baselines"].append({"key": v.key, "accuracy": base["accuracy"], "ci95": base["ci95"],
                                        "worst_topic_pair": (base["topic_pairs"] or [{}])[0]})
            key = f"reward/adversarial/baseline/{v.key}"
            metrics[f"{key}_accuracy"] = base["accuracy"]
            if base["topic_pairs"]:
                metrics[f"{key}_worst_topic_pair_accuracy"] = base["topic_pairs"][0]["accuracy"]
    return report, metrics


def _build(cfg: PipelineConfig, data_dir: Path, data: StageResult, sft: StageResult):
    def build(run: StageRun, out_dir: Path) -> None:
        preflight(cfg, "reward")  # refuse a stage that cannot fit the device before anything loads
        sft_dir = download(sft.artifact_uri, sft.digest)  # here, not before the look-up: a cache hit needs none
        model, tokenizer = build_reward(cfg, sft_dir, run)
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
        model, final = train_supervised("reward", REWARD_LOOP, cfg.resources, model, tokenizer, examples, rcfg,
                                        RunSink(run, n_batches(len(examples), rcfg.batch_size, rcfg.epochs,
                                                               rcfg.max_steps)),
                                        cfg.torch_threads, launch_id_of(run))
        pairs = rendered_pairs(read_pairs(data_dir / FILE_NAMES["eval_pairs"]).rows, rendering)
        device = ProcessGroup(device=cfg.resources.device).device
        with autocast(device, cfg.resources.mixed_precision)():
            chosen, rejected = (s.tolist() for s in pair_scores(model.to(device), tokenizer, pairs, rcfg.max_length,
                                                                rcfg.eval_batch_size, rcfg.share_prompts))
        report = rm_report(pairs, chosen, rejected, gold_breakdown if has_judge(data_dir) else None)
        train = training_pairs(examples, cfg.reward.baseline_train_pairs, cfg.reward.seed)
        ngram = ngram_model(train, cfg.reward.seed) if cfg.reward.baselines else None  # fit once, judged twice
        report["adversarial"], adversarial = _adversarial(cfg, data_dir, model, tokenizer, rendering, ngram, device)
        final.update(adversarial)
        final["reward/heldout_accuracy"] = report["accuracy"]
        final["reward/heldout_accuracy_ci95_low"], final["reward/heldout_accuracy_ci95_high"] = report["ci95"]
        if cfg.reward.baselines:
            report["baselines"], report["edge"] = _baselines(cfg, data_dir, sft_dir, train, ngram, pairs,
                                                             np.asarray(chosen) > np.asarray(rejected), device)
            final.update(baseline_metrics(report["baselines"]))
            if not report["edge"]["beats_loglik"]:
                alarm = ("the reward model does not beat the policy's zero-shot log-likelihood: "
                         f"{report['edge']['text']}")
                get_run_logger().warning("reward: alarm rm_no_edge: %s", alarm)
                run.set_tags({"rlhf.alarm.rm_no_edge": alarm})
        run.log_metrics(final, step=0)
        with tempfile.TemporaryDirectory(prefix="rlhf-rm-report-") as tmp:
            (Path(tmp) / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
            (Path(tmp) / "report.html").write_text(render_rm_report(cfg.name, report, chosen, rejected),
                                                   encoding="utf-8")
            run.log_dir(Path(tmp), "rm_report")
        save_model(model, tokenizer, out_dir)
    return build


@flow(name="reward", flow_run_name="reward-{config.name}")
def reward_stage(config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult) -> StageResult:
    """Train the reward model on ranked lists; report pairwise accuracy on held-out pairs."""
    ctx = on_node(ctx, config.resources)  # this node's role in a multi-node run (stages.follower.follow)
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
    upstream = {} if config.reward.name_or_path else {"sft": sft}
    result, _ = run_cached(ctx, "reward", section, upstream, fingerprint, _build(config, data_dir, data, sft))
    return as_state(result)
