"""The trained reward model on its held-out pairs: accuracy with its interval, the cheap baselines beside it, the
task's adversarial pairs where it writes them, and the report. The reward stage runs it after training; `rescore` runs it on a trained
RM and another data stage's held-out pairs (the chosen candidate on the test file, `benchmarks/rm_select.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.conversations import RewardRendering, rendered_pairs, rendered_ranked
from rlhf_lib.devices import autocast, weights_dtype
from rlhf_lib.model_dirs import load_causal_lm
from rlhf_lib.models import fit_length, load_tokenizer
from rlhf_lib.reward import pair_scores
from rlhf_lib.reward_report import adversarial_metrics, adversarial_report, rm_report
from stages.data import data_task, optional_digest
from stages.reward_models import build_reward, own_rendering, reward_base
from stages.rm_report import render_rm_report


def heldout_report(cfg: PipelineConfig, data_dir: Path, sft_dir: Path, model, tokenizer,
                   rendering: RewardRendering | None, examples: list, device,
                   base: str | None = None) -> tuple[dict[str, float], dict, str]:
    """The trained `model` (on `device`) on the data stage's held-out pairs, beside the baselines fit on the training
    lists `examples` when `reward.baselines` is on: (metrics, report, report HTML). `base`: the RM's own base model's
    folder (`stages.reward_models.reward_base`), whose features the linear probe reads."""
    r = cfg.reward
    pairs = rendered_pairs(read_pairs(data_dir / FILE_NAMES["eval_pairs"]).rows, rendering)
    with autocast(device, cfg.resources.mixed_precision)():
        chosen, rejected = (s.tolist() for s in pair_scores(model, tokenizer, pairs, fit_length(r.max_length, model),
                                                            r.eval_batch_size, r.share_prompts))
    task = data_task(data_dir)  # its gold judge's terms and its report sections (rlhf_lib.tasks)
    report = rm_report(pairs, chosen, rejected, task.gold.breakdown if task.gold else None)
    train = training_pairs(examples, r.baseline_train_pairs, r.seed)
    ngram = ngram_model(train, r.seed) if r.baselines else None  # fit once, judged twice
    report["adversarial"], metrics = adversarial(cfg, data_dir, model, tokenizer, rendering, ngram, device)
    metrics["reward/heldout_accuracy"] = report["accuracy"]
    metrics["reward/heldout_accuracy_ci95_low"], metrics["reward/heldout_accuracy_ci95_high"] = report["ci95"]
    if r.baselines:  # on the first reward.baseline_heldout_pairs pairs, the RM's verdicts on the same ones
        n = r.baseline_heldout_pairs or len(pairs)
        report["baselines"], report["edge"] = baselines(cfg, data_dir, sft_dir, base, train, ngram, pairs[:n],
                                                        (np.asarray(chosen) > np.asarray(rejected))[:n], device)
        metrics.update(baseline_metrics(report["baselines"]))
    return metrics, report, render_rm_report(cfg.name, report, chosen, rejected, task.rm_report_sections(report))


def no_edge_alarm(report: dict) -> str | None:
    """The rm_no_edge alarm's text when the baselines ran and the RM does not beat the zero-shot log-likelihood."""
    edge = report.get("edge")
    if edge is None or edge["beats_loglik"]:
        return None
    return f"the reward model does not beat the policy's zero-shot log-likelihood: {edge['text']}"


def rescore(cfg: PipelineConfig, data_dir: Path, sft_dir: Path, model_dir: Path, device) -> tuple[dict, dict, str]:
    """`heldout_report` of the reward model saved in `model_dir` (a reward stage's artifacts) on `data_dir`'s
    held-out pairs: the same figures its own stage would have given with that data stage (training is deterministic
    on a host, so retraining would give the same model), without training it again."""
    from rlhf_lib.model_dirs import load_scalar

    model = load_scalar(str(model_dir), cfg.reward.trust_remote_code, weights_dtype(cfg.model.dtype)).to(device)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=cfg.reward.trust_remote_code)
    rendering = own_rendering(cfg, data_dir, sft_dir, tokenizer)
    examples = rendered_ranked(read_ranked(data_dir / FILE_NAMES["preferences"]).rows, rendering)
    return heldout_report(cfg, data_dir, sft_dir, model.eval(), tokenizer, rendering, examples, device,
                          reward_base(cfg))


def baselines(cfg: PipelineConfig, data_dir: Path, sft_dir: Path, base_dir: str | None, train: list, ngram, pairs: list,
               rm_right: np.ndarray, device) -> tuple[list[dict], dict]:
    """The cheap baselines beside the trained RM on its held-out pairs (`rlhf_lib.baselines`), and whether it beats
    the policy's zero-shot log-likelihood. The log-likelihood reads the policy's own text with the SFT model; the
    probe reads the RM's starting point (its base model, frozen) on the pairs as the RM reads them."""
    r = cfg.reward
    precision = autocast(device, cfg.resources.mixed_precision)
    verdicts = [prefer_shorter(pairs), ngram(pairs)]
    policy, policy_tokenizer = load_causal_lm(sft_dir, cfg.model.trust_remote_code, weights_dtype(cfg.model.dtype))
    policy = policy.to(device).eval()
    raw = read_pairs(data_dir / FILE_NAMES["eval_pairs"]).rows[:len(pairs)]  # the same pairs, in the policy's text
    with precision():
        verdicts.append(zero_shot_loglik(policy, policy_tokenizer, raw, fit_length(r.max_length, policy),
                                         batch_size=8))
    del policy
    base, tokenizer = build_reward(cfg, sft_dir, base_dir)  # the RM before training: its backbone's features
    base = base.to(device).eval()
    with precision():
        verdicts.append(linear_probe(base, tokenizer, train, pairs, fit_length(r.max_length, base),
                                     r.eval_batch_size, r.seed))
    rows = baseline_rows(rm_right, verdicts, r.seed)
    beats, text = edge_verdict(float(rm_right.mean()), rows)
    return rows, {"beats_loglik": beats, "text": text}


def adversarial(cfg: PipelineConfig, data_dir: Path, model, tokenizer, rendering: RewardRendering | None,
                 ngram, device) -> tuple[dict, dict[str, float]]:
    """The task's adversarial minimal pairs (`adversarial_pairs.jsonl`, the demo's): accuracy by kind and by topic pair
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
