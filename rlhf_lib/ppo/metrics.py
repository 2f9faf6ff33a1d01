"""Diagnostics of a PPO update. Notation: B = batch, T = response length; `mask` (B, T), 1 on real tokens."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlhf_lib.envs.base import format_turns
from rlhf_lib.intervals import standard_error
from rlhf_lib.lm.generation import decode_responses, ends_with_eos
from rlhf_lib.lm.masked import masked_mean, masked_var
from rlhf_lib.ppo.types import Rollout


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """How much of the returns' variance the value head explains, over real tokens. Shape: (B, T) x3 -> float.

    EV = 1 - Var(R - V) / Var(R): 1 for a perfect value head, 0 for one predicting the mean return, < 0 for
    worse than that (the diagnostic of OpenAI baselines' PPO2). NaN when Var(R) = 0 (undefined).
    Biased variances: the n / (n - 1) factors cancel in the ratio, and one real token then gives NaN, not an error.

    Raises:
        ValueError: if the mask selects no element.
    """
    var_returns = masked_var(returns, mask, unbiased=False).item()
    if var_returns == 0.0:
        return float("nan")
    return 1.0 - masked_var(returns - values, mask, unbiased=False).item() / var_returns


# ppo_epochs' stat -> dashboard metric name.
UPDATE_METRICS = {
    "policy_loss": "loss/policy", "value_loss": "loss/value", "ptx_loss": "loss/ptx", "loss": "loss/total",
    "entropy": "policy/entropy", "clipfrac": "policy/clipfrac", "approx_kl": "policy/approx_kl",
    "ratio_mean": "policy/ratio_mean", "value_clipfrac": "value/clipfrac", "grad_norm": "grad_norm/total",
    "grad_norm_policy": "grad_norm/policy", "grad_norm_value": "grad_norm/value",
    "refused_steps": "update/refused_steps", "epochs": "update/epochs",
}


def spread(name: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std, min and max of `x` over real tokens, as `name/mean` ... Shape: x, mask (B, T)."""
    m = mask.bool()
    real = x[m]
    return {f"{name}/mean": float(masked_mean(x, m)), f"{name}/std": float(masked_var(x, m, unbiased=False).sqrt()),
            f"{name}/min": float(real.min()), f"{name}/max": float(real.max())}


def advantage_stats(ro: Rollout, advantages: Tensor, kl: dict[str, float], kl_coef: float,
                    score_stats: dict[str, float], reward_stats: dict[str, float]) -> dict[str, float]:
    """The dashboard metrics of phases 3 and 4: KL, scores, rewards, advantages (before whitening) and, with a
    critic, returns, values and explained variance. Shapes: advantages, ro.* (B, R)."""
    mask = ro.policy_mask
    stats = {
        "objective/kl_coef": kl_coef,
        "objective/kl": kl["kl_k1"], "objective/kl_k2": kl["kl_k2"], "objective/kl_k3": kl["kl_k3"],
        "objective/score_raw": float(ro.raw_scores.float().mean()),
        "objective/score_raw_sem": standard_error(ro.raw_scores.float().tolist()),
        "objective/score": reward_stats["score_mean"],
        "objective/score_clipfrac": score_stats["score_clipfrac"],
        "objective/non_score_reward": reward_stats["non_score_reward"],
        "objective/reward_total": reward_stats["reward_total"],
        **spread("advantages", advantages, mask),
    }
    if ro.returns is not None:
        stats.update(spread("returns", ro.returns, mask))
        stats["value/mean"] = float(masked_mean(ro.values, mask))
        stats["value/explained_variance"] = explained_variance(ro.values, ro.returns, mask)
    return stats


def update_stats(s: dict[str, float], all_refused: bool, critic_trains: bool) -> dict[str, float]:
    """`ppo_epochs`' statistics under their dashboard names; the losses are NaN when every step was refused (the
    `nan` alarm then says so)."""
    stats = {UPDATE_METRICS[k]: v for k, v in s.items() if k in UPDATE_METRICS}
    if all_refused:
        stats.update({name: math.nan for name in ("loss/total", "loss/policy")})
        if critic_trains:
            stats["loss/value"] = math.nan
    return stats


def response_stats(ro: Rollout, eos_token_id: int) -> dict[str, float]:
    """Length of the responses in the policy's own tokens (EOS included; a multi-turn rollout's environment tokens
    are not counted) and the share whose last turn ran out of tokens without EOS. Multi-turn rollouts add the
    policy turns per episode (`env/turns_mean`), the environment's tokens (`env/tokens_mean`) and its summed reward
    (`env/return_mean`)."""
    lengths = ro.policy_mask.sum(1).float()
    no_eos = ~ends_with_eos(ro.response, ro.response_mask, eos_token_id)
    stats = {"response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max()),
             "response/no_eos_frac": float(no_eos.float().mean())}
    if ro.turns is not None and ro.env_returns is not None:
        stats["env/turns_mean"] = sum(sum(t.role == "policy" for t in row) for row in ro.turns) / len(ro.turns)
        stats["env/step_errors"] = float(sum(t.failed for row in ro.turns for t in row))
        stats["env/tokens_mean"] = float((ro.response_mask.sum(1) - ro.policy_mask.sum(1)).float().mean())
        stats["env/return_mean"] = float(ro.env_returns.float().mean())
    return stats


def sample_rows(ro: Rollout, tokenizer, n: int) -> list[dict[str, object]]:
    """The first `n` rows of a scored rollout, for the sample table: prompt, response, whether it ended with EOS, the
    summed raw score and the shaped one, each reward source's raw score when there are several, and a multi-turn
    episode turn by turn (`turns`: "policy: ... | tool: ... | policy: ... (reward 1)")."""
    texts = decode_responses(tokenizer, ro.response[:n], ro.response_mask[:n])
    finished = ends_with_eos(ro.response[:n], ro.response_mask[:n], tokenizer.eos_token_id).tolist()
    parts = ro.score_parts if ro.score_parts and len(ro.score_parts) > 1 else {}
    return [{"prompt": p, "response": r, "finished": f, "score_raw": float(raw), "score": float(s)}
            | {f"score/{name}": float(v[i]) for name, v in parts.items()}
            | ({} if ro.turns is None else {"turns": format_turns(ro.turns[i])})
            for i, (p, r, f, raw, s) in enumerate(zip(ro.prompts[:n], texts, finished, ro.raw_scores[:n],
                                                      ro.scores[:n]))]
