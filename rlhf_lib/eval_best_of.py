"""The best-of-n baselines of the eval (`eval.best_of`, Gao et al. 2023): n samples of the SFT model per prompt,
the one the reward sources score highest kept (ranked with PPO's missing-EOS penalty, so both are judged by the same
shaped score), judged like the policy's replies."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch

from rlhf_lib.config import EvalConfig
from rlhf_lib.eval_pairs import Picked, head_to_head
from rlhf_lib.eval_sampling import Generations, Judge, SftMemo, generate_and_score, remembered
from rlhf_lib.intervals import mean_interval
from rlhf_lib.lm.generation import Decoder
from rlhf_lib.rewards.combine import RewardSet

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.envs.episodes import EpisodeRunner


def shaped_pick_scores(scores: torch.Tensor, has_eos: torch.Tensor,
                       missing_eos_penalty: float | None) -> torch.Tensor:
    """The scores best-of-n ranks by: the reward sources' sum less PPO's missing-EOS penalty where a reply has no EOS,
    so best-of-n and PPO are judged by the same shaped score (the offset, scale and clip of `rlhf_lib.ppo.shaping`
    preserve the order and are left out). Shapes: scores (m, n) float, has_eos (m, n) bool -> (m, n)."""
    if not missing_eos_penalty:
        return scores
    return torch.where(has_eos, scores, scores - missing_eos_penalty)


def best_of_n(sft: PreTrainedModel, rewards: RewardSet, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
              cfg: EvalConfig, max_prompt_tokens: int, judge: Judge | RewardSet | None, chunk: int | None,
              policy: Generations, runner: EpisodeRunner | None = None, memo: SftMemo | None = None,
              missing_eos_penalty: float | None = None, arms: Mapping[str, Generations] | None = None,
              decoder: Decoder | None = None) -> tuple[dict[str, float | None], dict[str, tuple[float, float]], dict[int, list[dict]]]:
    """The best-of-n baselines (`eval.best_of`): max(n) SFT samples of each of the first `eval.best_of_prompts`
    prompts (draw k seeded by eval.seed + 1 + k, so a smaller n's samples are a prefix of a larger n's), the one the
    reward sources score highest kept (less `missing_eos_penalty` on a reply without EOS: PPO's shaping), judged like the policy's replies on the same prompts. Per n: the kept replies'
    reward and gold means, PPO's lead over them in gold and its win rates (gold, reward), each with a bootstrap
    interval over prompts (a repeated prompt's rows together); and the best-of-n policy's KL to SFT,
    log n - (n - 1) / n (Stiennon et al. 2020). Third: per n, the kept reply of each prompt ({response, rm_score,
    gold}), for the report's samples. `memo` as in `evaluate`: each draw is remembered by its seed. `arms`: the other
    sampled policies (control arms, DPO), each compared with every best-of-n on the same prompts as PPO is
    (`<arm>_gold_lead_over_best_of_<n>`, `<arm>_win_rate_vs_best_of_<n>`, ...: `eval.head_to_head`)."""
    m = len(prompts) if cfg.best_of_prompts is None else min(cfg.best_of_prompts, len(prompts))
    sub = list(prompts[:m])

    def draw(k: int) -> Generations:
        return generate_and_score(sft, sft, rewards, tokenizer, sub, cfg.model_copy(update={"seed": cfg.seed + 1 + k}),
                                  max_prompt_tokens, judge, chunk=chunk, runner=runner, decoder=decoder)

    draws = [remembered(memo, cfg.seed + 1 + k, sub, partial(draw, k)) for k in range(max(cfg.best_of))]
    scores = torch.stack([d.scores for d in draws], 1)  # (m, max n)
    ranked = shaped_pick_scores(scores, torch.stack([d.has_eos for d in draws], 1), missing_eos_penalty)
    lengths = torch.stack([d.lengths for d in draws], 1)
    gold = torch.tensor([d.gold for d in draws], dtype=torch.float32).T if judge else None  # (m, max n)
    rows: dict[str, list[float]] = {}
    out: dict[str, float | None] = {"best_of_prompts": float(m)}
    rows_idx = torch.arange(m)
    picks: dict[int, list[dict]] = {}
    for n in sorted(set(cfg.best_of)):
        pick = ranked[:, :n].argmax(1)  # the first of equal scores
        kept = scores[rows_idx, pick]
        picks[n] = [{"response": draws[int(k)].texts[i], "rm_score": round(float(kept[i]), 4),
                     "gold": None if gold is None else round(float(gold[i, int(k)]), 4)} for i, k in enumerate(pick)]
        rows[f"best_of_{n}_reward_mean"] = kept.tolist()
        rows[f"best_of_{n}_response_length_mean"] = lengths[rows_idx, pick].tolist()
        kept_gold = gold[rows_idx, pick] if gold is not None else None
        if kept_gold is not None:
            rows[f"best_of_{n}_gold_mean"] = kept_gold.tolist()
        best = Picked(kept, None if kept_gold is None else kept_gold.tolist())
        for prefix, contender in {"": policy, **{f"{a}_": g for a, g in (arms or {}).items()}}.items():
            rows |= head_to_head(contender, best, prefix, f"best_of_{n}", m)  # paired: the same prompts
        out[f"best_of_{n}_kl"] = math.log(n) - (n - 1) / n
    out |= {k: sum(v) / len(v) for k, v in rows.items()}
    return out, {k: mean_interval(v, groups=sub) for k, v in rows.items()}, picks
