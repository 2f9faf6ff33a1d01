"""Held-out evaluation: sample the policy and the SFT model on the same prompts with the same seed, then compare
them under the reward sources PPO optimised (the reward model, functions, endpoints: their weighted sum and each one)
and, where the task has one, the gold judge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from rlhf_lib.config import EvalConfig
from rlhf_lib.eval_best_of import best_of_n
from rlhf_lib.eval_pairs import arms_head_to_head
from rlhf_lib.eval_groups import by_group
from rlhf_lib.eval_sampling import Generations, Judge, SftMemo, Terms, generate_and_score, remembered
from rlhf_lib.lm.generation import Decoder
from rlhf_lib.intervals import mean_interval, proportion_interval, win_indicators
from rlhf_lib.rewards.combine import RewardSet

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.envs.episodes import EpisodeRunner

__all__ = ["EvalResult", "Generations", "Judge", "SftMemo", "Terms", "best_of_n", "compare", "evaluate",
           "generate_and_score", "intervals", "per_row", "remembered", "sample_rows", "source_figures", "versus",
           "win_rate"]


@dataclass
class EvalResult:
    metrics: dict[str, float | None]
    samples: list[dict[str, object]] = field(default_factory=list)
    lengths: dict[str, list[float]] = field(default_factory=dict)  # response lengths, "PPO policy", "SFT", arms
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # 95 % interval of each metric
    gold: list[float] | None = None  # the judge's score of the policy's reply to each prompt, where there is one
    gold_sft: list[float] | None = None  # and of the SFT model's
    controls: dict[str, Generations] = field(default_factory=dict)  # each control arm's samples, by control name



def win_rate(a: torch.Tensor | Sequence[float], b: torch.Tensor | Sequence[float]) -> float:
    """Share of rows where `a` beats `b`, a tie counting half (identical models score 0.5). Shapes: (N,), (N,)."""
    return float(win_indicators(a, b).mean())


def compare(policy: Generations, sft: Generations) -> dict[str, float | None]:
    """Summary metrics of the policy against the SFT model (the names of docs/reference.md). `win_rate_vs_sft` is judged
    by the gold judge (null without one); `rm_win_rate_vs_sft` by the reward model PPO optimised, so it measures
    how well PPO optimised the proxy, not whether the responses got better."""
    m: dict[str, float | None] = {
        "reward_mean": float(policy.scores.mean()),
        "reward_mean_sft": float(sft.scores.mean()),
        "rm_win_rate_vs_sft": win_rate(policy.scores, sft.scores),
        "reward_lead_over_sft": float((policy.scores - sft.scores).mean()),  # paired: the same prompts
        "kl_to_ref": float(policy.kl_to_ref.mean()),
        "response_length_mean": float(policy.lengths.mean()),
        "response_length_mean_sft": float(sft.lengths.mean()),
        "no_eos_frac": float((~policy.has_eos).float().mean()),
        "gold_reward_mean": None, "gold_reward_mean_sft": None, "win_rate_vs_sft": None,
    }
    if policy.gold is not None and sft.gold is not None:
        g_pol, g_sft = torch.tensor(policy.gold), torch.tensor(sft.gold)
        m.update(gold_reward_mean=float(g_pol.mean()), gold_reward_mean_sft=float(g_sft.mean()),
                 win_rate_vs_sft=win_rate(g_pol, g_sft))
    for name, values in (policy.terms or {}).items():
        m[f"gold_{name}_mean"] = sum(values) / len(values)
        m[f"gold_{name}_mean_sft"] = sum(sft.terms[name]) / len(sft.terms[name])
        m[f"gold_{name}_delta"] = m[f"gold_{name}_mean"] - m[f"gold_{name}_mean_sft"]  # paired: same prompts
    for name, values in source_figures(policy).items():
        m[f"reward_{name}_mean"] = float(values.mean())
        m[f"reward_{name}_mean_sft"] = float(sft.parts[name].mean())
    return m


def source_figures(gens: Generations) -> dict[str, torch.Tensor]:
    """Each reward source's scores, when there is more than the reward model alone (`reward_mean` is then the RM's
    score and needs no second name)."""
    return {} if len(gens.parts) < 2 and "rm" in gens.parts or not gens.parts else gens.parts


def per_row(policy: Generations, sft: Generations) -> dict[str, list[float]]:
    """The per-prompt values whose means are `compare`'s metrics (win rates as 1 / 0.5 / 0 per prompt)."""
    rows = {"reward_mean": policy.scores.tolist(), "reward_mean_sft": sft.scores.tolist(),
            "rm_win_rate_vs_sft": win_indicators(policy.scores, sft.scores).tolist(),
            "reward_lead_over_sft": (policy.scores - sft.scores).tolist(),
            "kl_to_ref": policy.kl_to_ref.tolist(), "response_length_mean": policy.lengths.tolist(),
            "response_length_mean_sft": sft.lengths.tolist()}
    if policy.gold is not None and sft.gold is not None:
        rows.update(gold_reward_mean=policy.gold, gold_reward_mean_sft=sft.gold,
                    win_rate_vs_sft=win_indicators(policy.gold, sft.gold).tolist())
    for name, values in (policy.terms or {}).items():
        rows[f"gold_{name}_mean"], rows[f"gold_{name}_mean_sft"] = values, sft.terms[name]
        rows[f"gold_{name}_delta"] = [a - b for a, b in zip(values, sft.terms[name])]
    for name, values in source_figures(policy).items():
        rows[f"reward_{name}_mean"], rows[f"reward_{name}_mean_sft"] = values.tolist(), sft.parts[name].tolist()
    return rows


def intervals(policy: Generations, sft: Generations, prompts: Sequence[str] | None = None,
              ) -> dict[str, tuple[float, float]]:
    """95 % interval of each held-out metric: a seeded bootstrap over prompts for the means and win rates (the
    replies to a prompt asked more than once resampled together), Wilson's for the share of responses without
    EOS."""
    out = {k: mean_interval(v, groups=prompts) for k, v in per_row(policy, sft).items()}
    out["no_eos_frac"] = proportion_interval(int((~policy.has_eos).sum()), len(policy.texts))
    return out


def sample_rows(prompts: Sequence[str], policy: Generations, sft: Generations, n: int) -> list[dict[str, object]]:
    """The report's sample table: prompt, both responses and their scores."""
    rows = []
    for i in range(min(n, len(prompts))):
        rows.append({
            "prompt": prompts[i], "sft_response": sft.texts[i], "ppo_response": policy.texts[i],
            "sft_rm_score": round(float(sft.scores[i]), 4), "ppo_rm_score": round(float(policy.scores[i]), 4),
            "sft_gold": None if sft.gold is None else round(sft.gold[i], 4),
            "ppo_gold": None if policy.gold is None else round(policy.gold[i], 4),
        } | {f"{who}_{name}": round(float(g.parts[name][i]), 4) for name in source_figures(policy)
             for who, g in (("sft", sft), ("ppo", policy))}
          | ({} if policy.turns is None else {"sft_turns": sft.turns[i], "ppo_turns": policy.turns[i]}))
    return rows


def evaluate(
    policy: PreTrainedModel, sft: PreTrainedModel, rewards: RewardSet, tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str], cfg: EvalConfig, max_prompt_tokens: int, judge: Judge | RewardSet | None = None,
    chunk: int | None = None, terms: Terms | None = None, runner: EpisodeRunner | None = None,
    memo: SftMemo | None = None, controls: Mapping[str, PreTrainedModel] | None = None,
    missing_eos_penalty: float | None = None, groups: Sequence[str] | None = None, decoder: Decoder | None = None,
) -> EvalResult:
    """Held-out comparison of `policy` with `sft` (which is also the KL reference), with the judge's `terms` one by
    one where the task has them, and a 95 % interval of every figure. `memo`: where the SFT model's samples (its
    replies and best-of-n's draws) may come from instead of sampling them again. `controls`: the control arms' policies
    (`eval.controls`) and the DPO policy (`dpo`, with `dpo.enabled`), each sampled with the policy's seed and compared
    with it prompt by prompt (`versus`).
    `missing_eos_penalty`: PPO's, applied to best-of-n's pick so that it reranks by the score PPO's reward gets.
    `groups`: each prompt's group (`eval.group_by`'s column), for the figures group by group (`by_group`).
    `decoder`: every sampling call's (`generation.Decoder`; default eager)."""
    args = (rewards, tokenizer, prompts, cfg, max_prompt_tokens, judge)
    kw = {"chunk": chunk, "terms": terms, "runner": runner, "decoder": decoder}
    pol = generate_and_score(policy, sft, *args, **kw)
    base = remembered(memo, cfg.seed, prompts, lambda: generate_and_score(sft, sft, *args, **kw))
    metrics, bounds = compare(pol, base), intervals(pol, base, prompts)
    samples = sample_rows(prompts, pol, base, cfg.samples_in_report)
    arms = {name: generate_and_score(model, sft, *args, **kw) for name, model in (controls or {}).items()}
    for name, arm in arms.items():
        rows = versus(pol, arm, base, name)
        metrics.update({k: sum(v) / len(v) for k, v in rows.items()})
        bounds.update({k: mean_interval(v, groups=prompts) for k, v in rows.items()})
        metrics[f"{name}_no_eos_frac"] = float((~arm.has_eos).float().mean())
        for i, row in enumerate(samples):
            row.update({f"{name}_response": arm.texts[i], f"{name}_rm_score": round(float(arm.scores[i]), 4),
                        f"{name}_gold": None if arm.gold is None else round(arm.gold[i], 4)})
    pairs = arms_head_to_head(arms)
    metrics.update({k: sum(v) / len(v) for k, v in pairs.items()})
    bounds.update({k: mean_interval(v, groups=prompts) for k, v in pairs.items()})
    if groups is not None:
        more, more_bounds = by_group(cfg.group_by or "group", groups, prompts, pol, base, arms)
        metrics.update(more)
        bounds.update(more_bounds)
    if cfg.best_of:
        more, more_bounds, kept = best_of_n(sft, rewards, tokenizer, prompts, cfg, max_prompt_tokens, judge, chunk,
                                            pol, runner, memo, missing_eos_penalty, arms, decoder)
        metrics.update(more)
        bounds.update(more_bounds)
        for i, row in enumerate(samples[:int(more["best_of_prompts"])]):  # the kept reply of each n beside PPO's
            row.update({f"best_of_{n}_{k}": v for n, picks in kept.items() for k, v in picks[i].items()})
    lengths = {"PPO policy": pol.lengths.tolist(), "SFT": base.lengths.tolist()}
    lengths |= {"DPO policy" if name == "dpo" else f"control {name}": arm.lengths.tolist()
                for name, arm in arms.items()}
    return EvalResult(metrics, samples, lengths, bounds, pol.gold, base.gold, arms)


def versus(policy: Generations, arm: Generations, sft: Generations, name: str) -> dict[str, list[float]]:
    """The per-prompt rows of PPO against the control arm `name`, both sampled on the same prompts with the same seed:
    the arm's own figures (`<name>_reward_mean`, `_gold_reward_mean`, `_kl_to_ref`, `_response_length_mean`, its
    win rate over SFT by the judge and by the reward sources, `_rm_win_rate_vs_sft`) and PPO's paired lead over it
    (`reward_lead_over_<name>`, `gold_lead_over_<name>`,
    `reward_<source>_lead_over_<name>`) and win rates (`win_rate_vs_<name>` by the judge, `rm_win_rate_vs_<name>` by
    the reward sources). Their means are the metrics; a bootstrap over prompts gives the intervals. Shapes: each
    Generations holds N rows; each list here has N values."""
    rows = {f"{name}_reward_mean": arm.scores.tolist(), f"{name}_kl_to_ref": arm.kl_to_ref.tolist(),
            f"{name}_response_length_mean": arm.lengths.tolist(),
            f"reward_lead_over_{name}": (policy.scores - arm.scores).tolist(),
            f"rm_win_rate_vs_{name}": win_indicators(policy.scores, arm.scores).tolist(),
            f"{name}_rm_win_rate_vs_sft": win_indicators(arm.scores, sft.scores).tolist()}
    if policy.gold is not None and arm.gold is not None:
        rows[f"{name}_gold_reward_mean"] = list(arm.gold)
        rows[f"gold_lead_over_{name}"] = [a - b for a, b in zip(policy.gold, arm.gold)]
        rows[f"win_rate_vs_{name}"] = win_indicators(policy.gold, arm.gold).tolist()
        if sft.gold is not None:
            rows[f"{name}_win_rate_vs_sft"] = win_indicators(arm.gold, sft.gold).tolist()
    for source, values in source_figures(policy).items():
        rows[f"reward_{source}_lead_over_{name}"] = (values - arm.parts[source]).tolist()
    return rows
