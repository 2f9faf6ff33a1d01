"""The demo task's own figures in the eval report: the best constant reply (a lookup table PPO must beat) and the
gold figures by topic group (topics training never saw, training topics asked anew). Intervals resample a prompt's
repeated rows together (a cluster bootstrap)."""

from __future__ import annotations

from pathlib import Path

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_prompts
from rlhf_lib.demo_task import FILE_NAMES, TEST_TOPICS, VAL_TOPICS, gold_score, parse_topic
from rlhf_lib.demo_task.constant import best_constant, fill
from rlhf_lib.intervals import mean_interval, win_indicators
from rlhf_lib.models import fit_length
from rlhf_lib.reward import score_texts


def constant_reply(cfg: PipelineConfig, data_dir: Path, reward, tokenizer, prompts: list[str],
                   policy_gold: list[float], precision) -> tuple[dict, dict, str]:
    """The demo task's best constant reply (`rlhf_lib.demo_task.constant`): picked by the reward model's mean score
    on the first `eval.constant_reply_prompts` distinct validation prompts, then judged by gold on the eval prompts
    beside the policy's replies (its gold, PPO's lead over it, PPO's win rate against it, with intervals)."""
    val = read_prompts(data_dir / FILE_NAMES["prompts_val"]).rows
    val = list(dict.fromkeys(p.prompt for p in val))[:cfg.eval.constant_reply_prompts]
    max_length = fit_length(cfg.reward.max_length, reward)

    def score(ps: list[str], rs: list[str]) -> list[float]:
        with precision():
            return score_texts(reward, tokenizer, ps, rs, max_length, cfg.reward.eval_batch_size).tolist()

    template, _ = best_constant(score, val)
    gold = [gold_score(p, fill(template, p)) for p in prompts]
    rows = {"constant_reply_gold_mean": gold,
            "gold_lead_over_constant_reply": [a - b for a, b in zip(policy_gold, gold)],
            "win_rate_vs_constant_reply": win_indicators(policy_gold, gold).tolist()}
    # Each eval prompt is asked several times (data.eval_pairs_per_prompt): its rows are resampled together.
    bounds = {k: mean_interval(v, groups=prompts) for k, v in rows.items()}
    return {k: sum(v) / len(v) for k, v in rows.items()}, bounds, template


def by_topic_group(prompts: list[str], policy_gold: list[float], sft_gold: list[float]) -> tuple[dict, dict]:
    """The demo task's gold figures on prompts about topics training never saw (`new_topics`: the held-out split's
    own topics) and about training topics asked in new ways (`seen_topics`), with their intervals."""
    new = set(TEST_TOPICS + VAL_TOPICS)
    rows: dict[str, list[float]] = {}
    groups: dict[str, list[str]] = {}  # the prompt of each row: a prompt asked several times is one draw
    for group, keep in (("new_topics", True), ("seen_topics", False)):
        idx = [i for i, p in enumerate(prompts) if (parse_topic(p) in new) == keep]
        if idx:
            pol, sft = [policy_gold[i] for i in idx], [sft_gold[i] for i in idx]
            rows[f"gold_reward_mean_{group}"], rows[f"gold_reward_mean_sft_{group}"] = pol, sft
            rows[f"win_rate_vs_sft_{group}"] = win_indicators(pol, sft).tolist()
            for key in (f"gold_reward_mean_{group}", f"gold_reward_mean_sft_{group}", f"win_rate_vs_sft_{group}"):
                groups[key] = [prompts[i] for i in idx]
    return ({k: sum(v) / len(v) for k, v in rows.items()},
            {k: mean_interval(v, groups=groups[k]) for k, v in rows.items()})
