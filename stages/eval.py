"""Eval stage: the PPO policy against the SFT model on held-out prompts, beside PPO's control arms and (with
`dpo.enabled`) the DPO policy, and the report."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from mlflow.exceptions import MlflowException
from prefect import flow, get_run_logger

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_pairs, read_prompts
from rlhf_lib.data.collate import prompt_truncations
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.conversations import rendered_pairs, reward_rendering
from rlhf_lib.devices import DTYPES, autocast, weights_dtype
from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.envs.episodes import EpisodeRunner
from rlhf_lib.eval import evaluate
from rlhf_lib.eval_groups import group_values
from rlhf_lib.lm.compiled import CompiledDecoder
from rlhf_lib.intervals import proportion_interval
from rlhf_lib.model_dirs import load_causal_lm, load_scalar
from rlhf_lib.models import fit_length, load_tokenizer, same_tokenizer
from rlhf_lib.reward import pairwise_accuracy, score_texts
from rlhf_lib.rewards.combine import RewardSet
from rlhf_lib.rewards.judge import load_judge
from rlhf_lib.rewards.retokenize import RewardScorer
from rlhf_lib.tasks import Scorer
from stages.base import as_state, key_lock, log_dataset
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.data import conversations, dataset_name, file_digest, optional_digest, prompt_columns, source_info
from stages.eval_inputs import DPO_ARM, EvalInputs, control_stage, resolve_eval
from stages.eval_judge import load_eval_judge
from stages.eval_memo import SftMemo, memo_key
from stages.eval_upstream import measured_accuracy, ppo_alarms, ppo_history, ppo_tags, training_seconds
from stages.inputs import run_stage
from stages.report import render_html
from stages.tracking import RetryingClient, StageRun, model_version

MemoFor = Callable[[str], SftMemo]


def rm_scorer(cfg: PipelineConfig, reward, tokenizer, precision) -> Scorer:
    """The reward model's score of each (prompt, reply), in batches of `reward.eval_batch_size`."""
    max_length = fit_length(cfg.reward.max_length, reward)

    def score(prompts: list[str], responses: list[str]) -> list[float]:
        with precision():
            return score_texts(reward, tokenizer, prompts, responses, max_length, cfg.reward.eval_batch_size).tolist()
    return score


def _build(cfg: PipelineConfig, memo: MemoFor | None = None):
    """`memo(device)`: where the SFT side's samples are remembered (`stages.eval_memo`); None samples them all."""
    def build(run: StageRun, out_dir: Path, inputs: EvalInputs, dirs: Mapping[str, Path]) -> None:
        inputs.memory.enforce()  # refuse a stage that cannot fit the device before anything loads
        data_dir, data, upstream = inputs.data_dir, inputs.data, inputs.upstream
        judges, eval_judge, task = inputs.judges, inputs.eval_judge, inputs.task
        trust, dtype = cfg.model.trust_remote_code, weights_dtype(cfg.model.dtype)
        device = ProcessGroup(device=cfg.resources.device).device
        policy, tokenizer = load_causal_lm(dirs["ppo"], trust, dtype)
        sft, _ = load_causal_lm(dirs["sft"], trust, dtype)
        # The DPO policy first: one more arm, sampled and compared with PPO as a control is, and then with each
        # control (`dpo_win_rate_vs_zero_reward`: what DPO learned beyond PPO's shaping)
        arms = {DPO_ARM: load_causal_lm(dirs[DPO_ARM], trust, dtype)[0]} if DPO_ARM in dirs else {}
        arms |= {name: load_causal_lm(dirs[control_stage(name)], trust, dtype)[0] for name in cfg.eval.controls}
        reward = load_scalar(dirs["reward"], cfg.reward.trust_remote_code, dtype) if "reward" in dirs else None
        for model in filter(None, (policy, sft, reward, *arms.values())):
            model.to(device)
        reward_tokenizer = (load_tokenizer(dirs["reward"], trust_remote_code=cfg.reward.trust_remote_code)
                            if reward is not None else None)
        own = None if reward is None or same_tokenizer(tokenizer, reward_tokenizer) else reward_tokenizer
        prompts = [p.prompt for p in read_prompts(data_dir / FILE_NAMES["prompts_eval"]).rows][:cfg.eval.max_prompts]
        pairs = read_pairs(data_dir / FILE_NAMES["eval_pairs"]).rows
        rendering = None
        if own is not None:  # the RM reads its own template: the conversations of the prompts it will see
            table = conversations(data_dir, bool(cfg.reward.name_or_path))
            wanted = set(prompts) | {p.prompt for p in pairs}
            rendering = reward_rendering({p: m for p, m in table.items() if p in wanted}, False, own, cfg.data.render,
                                         tokenizer)
        rm = RewardScorer(reward, tokenizer, own, rendering) if reward is not None else None
        frozen = DTYPES[cfg.resources.frozen_dtype]
        graders = {s.name: load_judge(s, (judges or {})[s.name], frozen) for s in cfg.ppo.rewards if s.kind == "judge"}
        for grader in graders.values():
            grader.model.to(device)
        rewards = RewardSet(cfg.ppo.rewards, rm, tokenizer, prompt_columns(data_dir, "prompts_eval"),
                            cfg.eval.batch_size, judges=graders)
        log_dataset(run, [{"prompt": p} for p in prompts], f"{data.artifact_uri}/{FILE_NAMES['prompts_eval']}",
                    dataset_name(data_dir, "prompts_eval"), "evaluation", file_digest(data_dir, "prompts_eval"))
        judge, terms = (task.gold.score, task.gold.breakdown) if task.gold else (None, None)
        if cfg.eval.judge is not None:  # a judge PPO never optimised: the gold of this eval
            judge, terms = load_eval_judge(cfg, eval_judge, tokenizer, data_dir, rewards.columns, device), None
        groups = None if cfg.eval.group_by is None else group_values(
            cfg.eval.group_by, prompts, rewards.columns, str(data_dir / FILE_NAMES["prompts_eval"]))
        per_turn = cfg.ppo.model_copy(update={"max_new_tokens": cfg.eval.max_new_tokens})
        max_prompt = cfg.model.n_positions - per_turn.response_tokens
        precision = autocast(device, cfg.resources.mixed_precision)
        with precision():
            runner = EpisodeRunner.build(cfg.ppo, tokenizer, prompts, rewards.columns, cfg.eval.max_new_tokens)
            sft_memo = memo(str(device)) if memo is not None else None
            result = evaluate(policy, sft, rewards, tokenizer, prompts, cfg.eval, max_prompt, judge,
                              chunk=cfg.ppo.logprob_chunk, terms=terms, runner=runner, memo=sft_memo, controls=arms,
                              missing_eos_penalty=cfg.ppo.missing_eos_penalty, groups=groups,
                              decoder=CompiledDecoder() if cfg.ppo.rollout_engine == "compiled" else None)
        metrics = dict(result.metrics)
        metrics["truncated_prompts"] = prompt_truncations(tokenizer, prompts, max_prompt)
        bounds = dict(result.intervals)
        template = None
        if result.gold is not None and result.gold_sft is not None and terms is not None:
            more, more_bounds = task.gold_groups(prompts, result.gold, result.gold_sft)
            metrics.update(more)
            bounds.update(more_bounds)
        if (cfg.eval.constant_reply_prompts and terms is not None and result.gold is not None and reward is not None
                and own is None and optional_digest(data_dir, "prompts_val")):
            val = list(dict.fromkeys(p.prompt for p in read_prompts(data_dir / FILE_NAMES["prompts_val"]).rows))
            constant = task.constant_reply(val[:cfg.eval.constant_reply_prompts], prompts,
                                           rm_scorer(cfg, reward, tokenizer, precision), result.gold)
            if constant is not None:
                metrics.update(constant.metrics)
                bounds.update(constant.bounds)
                template = constant.template
        # Held-out pairs: noise-free judge pairs on the demo task, held-out human labels on user data. No RM (the
        # reward came from functions and endpoints only): no accuracy.
        metrics["reward_model_accuracy"] = None
        if reward is not None:
            metrics["reward_model_accuracy"] = measured_accuracy(upstream["reward"])
            if metrics["reward_model_accuracy"] is None:
                max_length = fit_length(cfg.reward.max_length, reward)
                with precision():
                    metrics["reward_model_accuracy"] = pairwise_accuracy(
                        reward, reward_tokenizer, rendered_pairs(pairs, rendering), max_length,
                        cfg.reward.eval_batch_size)
            bounds["reward_model_accuracy"] = proportion_interval(
                round(metrics["reward_model_accuracy"] * len(pairs)), len(pairs))
        judged = pairs[:cfg.eval.judge_pairs]  # each judge's agreement with the held-out labels, as the RM's
        for name, grader in graders.items():
            with precision():
                chosen = grader.scores([p.prompt for p in judged], [p.chosen for p in judged])
                rejected = grader.scores([p.prompt for p in judged], [p.rejected for p in judged])
            right = int((chosen > rejected).sum())
            metrics[f"judge_{name}_accuracy"] = right / len(judged) if judged else None
            bounds[f"judge_{name}_accuracy"] = proportion_interval(right, len(judged))
        run.log_metrics({f"eval/{k}": v for k, v in metrics.items() if v is not None}, step=0)
        run.log_metrics({f"eval/{k}_ci95_{end}": v for k, (lo, hi) in bounds.items()
                         for end, v in (("low", lo), ("high", hi)) if math.isfinite(v)}, step=0)
        info = source_info(data_dir)
        summary = {
            "name": cfg.name,
            "lineage": {f"{k} model": v.model_uri or v.mlflow_run_id for k, v in upstream.items()}
            | {"data run": data.mlflow_run_id, "data": info.get("name", "demo task"), "eval prompts": len(prompts),
               "held-out pairs": len(pairs), **({"pairs each judge read": len(judged)} if graders else {}),
               "judge": (cfg.eval.judge.describe().replace("reward", "eval.judge", 1) if cfg.eval.judge
                         else task.gold.name if judge else "none: RM-judged only"),
               "reward sources": ", ".join(f"{s.name} ({s.kind}, weight {s.weight:g})" for s in cfg.ppo.rewards)}
            | ({"constant reply (picked by the RM on validation)": template.strip()} if template else {})
            | ({"SFT samples": sft_memo.describe()} if sft_memo is not None else {}),
            "metrics": metrics,
            "intervals": {k: [lo, hi] for k, (lo, hi) in bounds.items()},
            "training_seconds": training_seconds(upstream),  # report only: wall time is not a reproducible figure
            "judge_terms": list(task.gold.terms) if terms is not None else [],
        }
        (out_dir / "samples.json").write_text(json.dumps(result.samples, indent=1, ensure_ascii=False))
        history = ppo_history(upstream["ppo"].mlflow_run_id, cfg)
        tags = ppo_tags(upstream["ppo"].mlflow_run_id)
        alarms = ppo_alarms(tags)
        if (rm := upstream.get("reward")) is not None and rm.mlflow_run_id:  # raised before PPO: rm_no_edge
            alarms = [f"reward stage: {a}" for a in ppo_alarms(ppo_tags(rm.mlflow_run_id))] + alarms
        summary["alarms"] = alarms
        if "rlhf.kept" in tags:  # ppo.keep: which iteration's policy this is
            kept = tags["rlhf.kept"]
            summary["lineage"]["kept policy"] = kept + (" (picked on held-out prompts: the figures below are "
                                                        "optimistic for them)" if kept.startswith("best") else "")
        (out_dir / "report.json").write_text(json.dumps(summary, indent=2))
        html = render_html(summary, history, result.samples, result.lengths, alarms)
        (out_dir / "report.html").write_text(html, encoding="utf-8")
        run.log_table(result.samples, "samples_table.json")
    return build


@flow(name="eval", flow_run_name="eval-{config.name}")
def eval_stage(config: PipelineConfig, ctx: RunContext, data: StageResult, sft: StageResult,
               reward: StageResult | None, ppo: StageResult,
               controls: dict[str, StageResult] | None = None,
               dpo: StageResult | None = None) -> tuple[StageResult, dict]:
    """Evaluate on held-out prompts; returns the stage result and the report's metrics. `reward` is None when no
    reward source of `ppo.rewards` is a model. `controls`: the PPO control arms of `eval.controls`, by name. `dpo`:
    the DPO stage's policy (`dpo.enabled`), sampled beside PPO as one more arm, `dpo`: its figures `dpo_*` and PPO's
    paired leads over it (`reward_lead_over_dpo`, ...); it joins the cache key only when given."""
    ctx = on_node(ctx, config.resources)  # node 0 evaluates; another node waits for its report
    controls = controls or {}
    if missing := [c for c in config.eval.controls if c not in controls]:
        raise ValueError(f"eval.controls: no PPO run of the control arm(s) {missing} was given to the eval stage")
    inputs = resolve_eval(config, data, sft, reward, ppo, controls, dpo)
    section, upstream, fingerprint = dict(inputs.section), dict(inputs.upstream), inputs.fingerprint

    def memo(device: str) -> SftMemo:  # --force eval samples the SFT side again too
        key = memo_key(section, upstream, fingerprint, device, config.resources.frozen_dtype)
        return SftMemo(key, refresh="eval" in ctx.force)

    result, local = run_stage(ctx, "eval", inputs, _build(config, memo), fetch=True)  # the report
    report = json.loads((local / "report.json").read_text())
    metrics = report["metrics"]
    if result.status == "ran" and ppo.model_uri:
        promote_champion(ppo.model_uri, metrics)
    # The summary's eval figures, each with its 95 % interval under `<name>_ci95`.
    bounds = {f"{k}_ci95": v for k, v in report.get("intervals", {}).items()}
    return as_state(result, (result, metrics | bounds))


def champion_metric(metrics: dict) -> str:
    """The held-out gold win rate where the task has a judge, else the RM reward."""
    return "win_rate_vs_sft" if metrics.get("win_rate_vs_sft") is not None else "reward_mean"


def promote_champion(policy_uri: str, metrics: dict) -> bool:
    """Tag the policy version with its eval metric and give it the `champion` alias when it beats the current
    champion's (or there is none). Returns whether it became champion."""
    key = champion_metric(metrics)
    mv = model_version(policy_uri)
    client = RetryingClient()
    value = float(metrics[key])
    client.set_model_version_tag(mv.name, mv.version, f"rlhf.eval.{key}", str(value))
    with key_lock("champion", mv.name):  # two evals finishing together must not both win on a stale read
        try:
            champ = client.get_model_version_by_alias(mv.name, "champion")
            best = float(champ.tags.get(f"rlhf.eval.{key}", "-inf"))
        except MlflowException:
            champ, best = None, float("-inf")
        if champ is not None and (champ.version == mv.version or value <= best):
            return False
        client.set_registered_model_alias(mv.name, "champion", mv.version)
    get_run_logger().info("%s is the new champion (%s = %.4f, was %.4f)", policy_uri, key, value, best)
    return True
