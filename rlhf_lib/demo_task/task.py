"""The demo task behind the task protocol (`rlhf_lib.task_protocol.Task`): its data, its hidden gold judge, the eval's
figures by topic group and its best constant reply, and the reward report's adversarial minimal pairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf_lib.intervals import mean_interval, win_indicators, with_interval
from rlhf_lib.task_protocol import BaseTask, Bounds, BuiltData, ConstantReply, Digests, GoldJudge, ReportSection, Scorer

from .builder import build_demo_task, summarize
from .constant import best_constant, fill
from .judge import gold_breakdown, gold_score
from .slots import TEST_TOPICS, VAL_TOPICS, parse_topic

TERMS = ("topic", "detail", "tone", "length", "ending", "repetition")  # gold_breakdown's, in the report's order


class DemoTask(BaseTask):
    name = "demo"
    gold = GoldJudge(gold_score, gold_breakdown, "gold judge (demo task)", TERMS)

    def identity(self, cfg, digests: Digests) -> tuple[dict[str, Any], str]:
        return {"data": cfg.data.key()}, "demo"  # deterministic from data.seed and the data keys

    def build(self, cfg, out_dir: Path, renderer) -> BuiltData:
        paths = build_demo_task(cfg.data, out_dir)
        stats = summarize(paths)
        return BuiltData(paths, "demo", {"source": "demo", "judge": "demo"},
                         metrics={f"data/{k}": v for k, v in stats.items()})

    def gold_groups(self, prompts: Sequence[str], policy_gold: Sequence[float],
                    sft_gold: Sequence[float]) -> tuple[dict[str, float], Bounds]:
        """The gold figures on prompts about topics training never saw (`new_topics`: the held-out split's own
        topics) and about training topics asked in new ways (`seen_topics`), with their intervals (a prompt asked
        several times is one draw)."""
        new = set(TEST_TOPICS + VAL_TOPICS)
        rows: dict[str, list[float]] = {}
        groups: dict[str, list[str]] = {}
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

    def constant_reply(self, val_prompts: Sequence[str], prompts: Sequence[str], score: Scorer,
                       policy_gold: Sequence[float]) -> ConstantReply | None:
        """The best constant reply (`constant.py`: one template, the topic filled in), picked by `score`'s mean on
        the validation prompts, then judged by gold on the eval prompts beside the policy's replies: its gold, the
        policy's lead over it and win rate against it, each prompt's repeated rows resampled together."""
        template, _ = best_constant(score, list(val_prompts))
        gold = [gold_score(p, fill(template, p)) for p in prompts]
        rows = {"constant_reply_gold_mean": gold,
                "gold_lead_over_constant_reply": [a - b for a, b in zip(policy_gold, gold)],
                "win_rate_vs_constant_reply": win_indicators(policy_gold, gold).tolist()}
        bounds = {k: mean_interval(v, groups=list(prompts)) for k, v in rows.items()}
        return ConstantReply({k: sum(v) / len(v) for k, v in rows.items()}, bounds, template)

    def rm_report_sections(self, report: Mapping[str, Any]) -> list[ReportSection]:
        """The adversarial minimal pairs (`adversarial.py`): by kind, the baselines on them, the worst topic pairs."""
        adv = report.get("adversarial")
        if not adv:
            return []

        def rows(items, key):
            return tuple({key: it[key], "pairs": it["pairs"],
                          "accuracy [95 %]": with_interval(it["accuracy"], it["ci95"])} for it in items)

        base = tuple({"baseline": b["key"], "accuracy [95 %]": with_interval(b["accuracy"], b["ci95"]),
                      "its worst topic pair": f"{b['worst_topic_pair'].get('topic_pair', '')} "
                                              f"{b['worst_topic_pair'].get('accuracy', float('nan')):.3g}"}
                     for b in adv.get("baselines", []))
        text = (f"{adv['pairs']} pairs (a clean response against its flawed twin): "
                f"{with_interval(adv['accuracy'], adv['ci95'])}; {adv['weak_topic_pairs']} of "
                f"{len(adv['topic_pairs'])} topic pairs under {adv['floor']:g}.")
        tables = (("", rows(adv["by_kind"], "kind")), *((("", base),) if base else ()),
                  ("Worst topic pairs (the response about the other topic should lose)",
                   rows(adv["worst_topic_pairs"], "topic_pair")))
        return [ReportSection("Adversarial minimal pairs", text, tables)]


TASK = DemoTask()
