"""Held-out evaluation: sample the policy and the SFT model on the same prompts with the same seed, then compare
them under the reward sources PPO optimised (the reward model, functions, endpoints: their weighted sum and each one)
and, where the task has one, the gold judge."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch

from rlhf_lib.config import EvalConfig
from rlhf_lib.envs.base import format_turns
from rlhf_lib.intervals import mean_interval, proportion_interval, win_indicators
from rlhf_lib.lm.generation import decode_responses, encode_prompts, ends_with_eos, sample
from rlhf_lib.lm.kl import kl_per_token
from rlhf_lib.lm.masked import masked_sum
from rlhf_lib.lm.scoring import response_logprobs
from rlhf_lib.rewards.combine import RewardSet

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.envs.episodes import EpisodeRunner

Judge = Callable[[str, str], float]  # the demo task's gold judge; eval.judge comes as a RewardSet of its one source
Terms = Callable[[str, str], dict[str, float]]  # the judge's score term by term (the demo task's gold_breakdown)
# The SFT side's memo: (seed, prompts, compute) -> the SFT model's Generations of those prompts under that seed, from
# `compute()` or a store of earlier ones (stages/eval_memo.py). Nothing of it depends on the PPO policy.
SftMemo = Callable[[int, Sequence[str], Callable[[], "Generations"]], "Generations"]


@dataclass
class Generations:
    """Samples of one model on the eval prompts. Per-response tensors have shape (N,)."""

    texts: list[str]
    scores: torch.Tensor  # the weighted sum of the reward sources
    lengths: torch.Tensor
    has_eos: torch.Tensor
    kl_to_ref: torch.Tensor
    gold: list[float] | None = None
    terms: dict[str, list[float]] | None = None  # the judge's terms per response, by term name
    parts: dict[str, torch.Tensor] = field(default_factory=dict)  # each reward source's raw score, by name
    turns: list[str] | None = None  # multi-turn: each episode turn by turn ("policy: ... | tool: ... | ...")


@dataclass
class EvalResult:
    metrics: dict[str, float | None]
    samples: list[dict[str, object]] = field(default_factory=list)
    lengths: dict[str, list[float]] = field(default_factory=dict)  # response lengths, "PPO policy" and "SFT"
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # 95 % interval of each metric
    gold: list[float] | None = None  # the judge's score of the policy's reply to each prompt, where there is one
    gold_sft: list[float] | None = None  # and of the SFT model's


@torch.inference_mode()
def generate_and_score(
    model: PreTrainedModel, ref: PreTrainedModel, rewards: RewardSet, tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str], cfg: EvalConfig, max_prompt_tokens: int, judge: Judge | RewardSet | None,
    chunk: int | None = None, terms: Terms | None = None, runner: EpisodeRunner | None = None,
) -> Generations:
    """Sample `model` on `prompts` (seeded by `cfg.seed`, `cfg.batch_size` prompts at a time), and score each
    response with the reward sources (`rewards`: the RM through its own tokenizer where it has one, functions,
    endpoints), the KL to `ref` (sum over tokens of log pi - log pi_ref, k1, in nats) and the judge. The models may
    sit on any device; the figures come back as float32 on the CPU. `chunk`: response positions projected to the vocabulary at a time in the KL's log-probs.
    With a `runner` (ppo.environment) each prompt is a multi-turn episode: the KL and the length count the policy's
    own tokens, the text is the last policy turn and `turns` holds each episode turn by turn."""
    gen = torch.Generator().manual_seed(cfg.seed)
    texts, scores, parts, lengths, eos, kls, turns, judged = [], [], [], [], [], [], [], []
    batch_size = cfg.batch_size
    for i in range(0, len(prompts), batch_size):
        q, qm = encode_prompts(tokenizer, prompts[i : i + batch_size], max_prompt_tokens)
        chunk_prompts, extra = prompts[i : i + batch_size], {}
        if runner is not None:
            ep = runner(model, chunk_prompts, q, qm, cfg.temperature, gen)
            r, rm, act = ep.response, ep.response_mask, ep.action_mask
            logp, _ = response_logprobs(model, q, qm, r, rm, cfg.temperature, chunk=chunk)
            extra = {"env_returns": ep.returns, "completions": [t[-1].text for t in ep.turns]}
            turns += [format_turns(t) for t in ep.turns]
            texts += extra["completions"]
        else:
            r, rm, logp = sample(model, q, qm, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                 generator=gen)
            act = rm
            texts += decode_responses(tokenizer, r, rm)
        # The SFT model and best-of-n's draws are scored against themselves: their KL is 0 by definition (only float
        # rounding apart), so the reference's forward is skipped.
        ref_logp = logp if ref is model else response_logprobs(ref, q, qm, r, rm, cfg.temperature, chunk=chunk)[0]
        device = r.device
        got = rewards(chunk_prompts, q.to(device), qm.to(device), r, rm, **extra)
        if isinstance(judge, RewardSet):  # eval.judge: a source PPO never optimised, on the same tokens
            judged.append(judge(chunk_prompts, q.to(device), qm.to(device), r, rm, **extra).total.float().cpu())
        scores.append(got.total.float().cpu())
        parts.append({k: v.float().cpu() for k, v in got.parts.items()})
        lengths.append(act.sum(1).float().cpu())
        eos.append(ends_with_eos(r, rm, tokenizer.eos_token_id).cpu())
        kls.append(masked_sum(kl_per_token(logp, ref_logp, "k1"), act, dim=1).float().cpu())
    if isinstance(judge, RewardSet):
        gold = torch.cat(judged).tolist() if judged else []
    else:
        gold = [judge(p, t) for p, t in zip(prompts, texts)] if judge else None
    by_term = None
    if terms is not None:
        rows = [terms(p, t) for p, t in zip(prompts, texts)]
        by_term = {name: [r[name] for r in rows] for name in (rows[0] if rows else {})}
    by_source = {name: torch.cat([p[name] for p in parts]) for name in (parts[0] if parts else {})}
    return Generations(texts, torch.cat(scores), torch.cat(lengths), torch.cat(eos), torch.cat(kls), gold, by_term,
                       by_source, turns or None)


def remembered(memo: SftMemo | None, seed: int, prompts: Sequence[str], compute: Callable[[], Generations],
               ) -> Generations:
    """`compute()`, or with a `memo` the SFT samples it holds for this seed and these prompts."""
    return compute() if memo is None else memo(seed, prompts, compute)


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
    memo: SftMemo | None = None,
) -> EvalResult:
    """Held-out comparison of `policy` with `sft` (which is also the KL reference), with the judge's `terms` one by
    one where the task has them, and a 95 % interval of every figure. `memo`: where the SFT model's samples (its
    replies and best-of-n's draws) may come from instead of sampling them again."""
    args = (rewards, tokenizer, prompts, cfg, max_prompt_tokens, judge)
    kw = {"chunk": chunk, "terms": terms, "runner": runner}
    pol = generate_and_score(policy, sft, *args, **kw)
    base = remembered(memo, cfg.seed, prompts, lambda: generate_and_score(sft, sft, *args, **kw))
    metrics, bounds = compare(pol, base), intervals(pol, base, prompts)
    samples = sample_rows(prompts, pol, base, cfg.samples_in_report)
    if cfg.best_of:
        more, more_bounds, kept = best_of_n(sft, rewards, tokenizer, prompts, cfg, max_prompt_tokens, judge, chunk,
                                            pol, runner, memo)
        metrics.update(more)
        bounds.update(more_bounds)
        for i, row in enumerate(samples[:int(more["best_of_prompts"])]):  # the kept reply of each n beside PPO's
            row.update({f"best_of_{n}_{k}": v for n, picks in kept.items() for k, v in picks[i].items()})
    return EvalResult(metrics, samples,
                      {"PPO policy": pol.lengths.tolist(), "SFT": base.lengths.tolist()}, bounds, pol.gold, base.gold)


def best_of_n(sft: PreTrainedModel, rewards: RewardSet, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
              cfg: EvalConfig, max_prompt_tokens: int, judge: Judge | RewardSet | None, chunk: int | None,
              policy: Generations, runner: EpisodeRunner | None = None, memo: SftMemo | None = None,
              ) -> tuple[dict[str, float | None], dict[str, tuple[float, float]], dict[int, list[dict]]]:
    """The best-of-n baselines (`eval.best_of`): max(n) SFT samples of each of the first `eval.best_of_prompts`
    prompts (draw k seeded by eval.seed + 1 + k, so a smaller n's samples are a prefix of a larger n's), the one the
    reward sources score highest kept, judged like the policy's replies on the same prompts. Per n: the kept replies'
    reward and gold means, PPO's lead over them in gold and its win rates (gold, reward), each with a bootstrap
    interval over prompts (a repeated prompt's rows together); and the best-of-n policy's KL to SFT,
    log n - (n - 1) / n (Stiennon et al. 2020). Third: per n, the kept reply of each prompt ({response, rm_score,
    gold}), for the report's samples. `memo` as in `evaluate`: each draw is remembered by its seed."""
    m = len(prompts) if cfg.best_of_prompts is None else min(cfg.best_of_prompts, len(prompts))
    sub = list(prompts[:m])

    def draw(k: int) -> Generations:
        return generate_and_score(sft, sft, rewards, tokenizer, sub, cfg.model_copy(update={"seed": cfg.seed + 1 + k}),
                                  max_prompt_tokens, judge, chunk=chunk, runner=runner)

    draws = [remembered(memo, cfg.seed + 1 + k, sub, partial(draw, k)) for k in range(max(cfg.best_of))]
    scores = torch.stack([d.scores for d in draws], 1)  # (m, max n)
    lengths = torch.stack([d.lengths for d in draws], 1)
    gold = torch.tensor([d.gold for d in draws], dtype=torch.float32).T if judge else None  # (m, max n)
    rows: dict[str, list[float]] = {}
    out: dict[str, float | None] = {"best_of_prompts": float(m)}
    rows_idx = torch.arange(m)
    picks: dict[int, list[dict]] = {}
    for n in sorted(set(cfg.best_of)):
        pick = scores[:, :n].argmax(1)  # the first of equal scores
        kept = scores[rows_idx, pick]
        picks[n] = [{"response": draws[int(k)].texts[i], "rm_score": round(float(kept[i]), 4),
                     "gold": None if gold is None else round(float(gold[i, int(k)]), 4)} for i, k in enumerate(pick)]
        rows[f"best_of_{n}_reward_mean"] = kept.tolist()
        rows[f"best_of_{n}_response_length_mean"] = lengths[rows_idx, pick].tolist()
        rows[f"rm_win_rate_vs_best_of_{n}"] = win_indicators(policy.scores[:m], kept).tolist()
        if gold is not None and policy.gold is not None:
            kept_gold, pol_gold = gold[rows_idx, pick], torch.tensor(policy.gold[:m], dtype=torch.float32)
            rows[f"best_of_{n}_gold_mean"] = kept_gold.tolist()
            rows[f"gold_lead_over_best_of_{n}"] = (pol_gold - kept_gold).tolist()
            rows[f"win_rate_vs_best_of_{n}"] = win_indicators(pol_gold, kept_gold).tolist()
        out[f"best_of_{n}_kl"] = math.log(n) - (n - 1) / n
    out |= {k: sum(v) / len(v) for k, v in rows.items()}
    return out, {k: mean_interval(v, groups=sub) for k, v in rows.items()}, picks
