"""Sampling and scoring one model on the eval prompts (`generate_and_score`), the samples it returns
(`Generations`), and the memo that may serve the SFT side instead (`remembered`): the part of the eval that the
policy comparison (`rlhf_lib.eval`) and the best-of-n baselines (`rlhf_lib.eval_best_of`) share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from rlhf_lib.config import EvalConfig
from rlhf_lib.envs.base import format_turns
from rlhf_lib.lm.generation import Decoder, decode_responses, encode_prompts, ends_with_eos, sample
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


@torch.inference_mode()
def generate_and_score(
    model: PreTrainedModel, ref: PreTrainedModel, rewards: RewardSet, tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str], cfg: EvalConfig, max_prompt_tokens: int, judge: Judge | RewardSet | None,
    chunk: int | None = None, terms: Terms | None = None, runner: EpisodeRunner | None = None,
    decoder: Decoder | None = None,
) -> Generations:
    """Sample `model` on `prompts` (seeded by `cfg.seed`, `cfg.batch_size` prompts at a time), and score each
    response with the reward sources (`rewards`: the RM through its own tokenizer where it has one, functions,
    endpoints), the KL to `ref` (sum over tokens of log pi - log pi_ref, k1, in nats) and the judge. The models may
    sit on any device; the figures come back as float32 on the CPU. `chunk`: response positions projected to the vocabulary at a time in the KL's log-probs.
    With a `runner` (ppo.environment) each prompt is a multi-turn episode: the KL and the length count the policy's
    own tokens, the text is the last policy turn and `turns` holds each episode turn by turn. `decoder`: the sampling
    loop's (`ppo.rollout_engine: compiled` gives a `CompiledDecoder`; default eager)."""
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
                                 generator=gen, decoder=decoder)
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
