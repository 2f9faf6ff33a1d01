"""The reward stage's report (`rm_report/report.html` and `report.json` in the reward run): the numbers of
`rlhf_lib.reward_report` as tables, and the score distributions of chosen and rejected responses as a plot."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from rlhf_lib.intervals import with_interval
from rlhf_lib.tasks import ReportSection
from stages.report import _img, _table, hist_png


def scores_png(chosen: Sequence[float], rejected: Sequence[float]) -> str | None:
    """Histograms of the RM's scores of chosen and rejected held-out responses: the farther apart, the surer."""
    return hist_png({"chosen": list(chosen), "rejected": list(rejected)}, "reward-model score", "held-out responses")


def _rows(items: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [{key: it[key], "pairs": it["pairs"], "accuracy [95 %]": with_interval(it["accuracy"], it["ci95"])}
            for it in items]


def _baseline_section(report: dict[str, Any]) -> list[str]:
    """The baselines beside the model on the same pairs (`rlhf_lib.baselines`), and the edge verdict."""
    if not report.get("baselines"):
        return []
    rows = [{"baseline": b["name"], "accuracy [95 %]": with_interval(b["accuracy"], b["ci95"]),
             "reward model's lead [95 %]": with_interval(b["rm_lead"], b["rm_lead_ci95"]), "how": b.get("detail", "")}
            for b in report["baselines"]]
    edge = report["edge"]
    verdict = ("beats" if edge["beats_loglik"] else "<b>does not beat</b> (alarm rm_no_edge)")
    return ["<h2>Baselines on the same pairs</h2>", _table(rows),
            f"<p>The reward model {verdict} the policy's zero-shot log-likelihood: {html.escape(edge['text'])}.</p>"]


def _task_section(section: ReportSection) -> list[str]:
    """A section the task adds (`rlhf_lib.tasks.ReportSection`): its title, paragraph and tables."""
    out = [f"<h2>{html.escape(section.title)}</h2><p>{html.escape(section.text)}</p>"]
    for caption, rows in section.tables:
        out += [f"<h3>{html.escape(caption)}</h3>"] if caption else []
        out.append(_table([dict(r) for r in rows]))
    return out


def render_rm_report(name: str, report: dict[str, Any], chosen: Sequence[float], rejected: Sequence[float],
                     sections: Sequence[ReportSection] = ()) -> str:
    """The report page: accuracy, the baselines, the task's own `sections` (the demo's adversarial pairs), by margin,
    by judge term, by category, the score plot, the confident mistakes."""
    sections = [f"<h2>Held-out pairwise accuracy</h2><p>{report['pairs']} pairs: "
                f"{html.escape(with_interval(report['accuracy'], report['ci95']))}</p>",
                *_baseline_section(report), *(part for sec in sections for part in _task_section(sec)),
                "<h2>Accuracy by |score margin| (is it surer when it is right?)</h2>"
                f"{_table(_rows(report['by_margin'], 'margin'))}"]
    if report.get("by_term"):
        sections.append("<h2>Accuracy on the pairs that differ in each gold-judge term</h2>"
                        f"{_table(_rows(report['by_term'], 'term'))}")
    if report.get("by_category"):
        sections.append(f"<h2>Accuracy by category</h2>{_table(_rows(report['by_category'], 'category'))}")
    stats = [{"responses": k, **{s: round(v, 4) for s, v in d.items()}} for k, d in report["scores"].items()]
    sections += [f"<h2>Scores of chosen and rejected responses</h2>{_table(stats)}"
                 f"{_img(scores_png(chosen, rejected), 'score distributions')}",
                 f"<h2>Most confident mistakes</h2>{_table(report['mistakes'])}"]
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;"
             "white-space:pre-wrap}th{background:#f3f3f3}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Reward model report</title><style>{style}"
            f"</style></head><body><h1>Reward model report: {html.escape(name)}</h1>{''.join(sections)}</body></html>")
