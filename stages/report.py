"""The eval report: one self-contained HTML file (plots embedded as PNG) plus the same numbers as JSON."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from rlhf_lib.intervals import with_interval
from stages.plotting import png as _png
from stages.plotting import pyplot as _plt
from stages.report_best_of import baselines_table, overoptimisation_heldout_png
from stages.report_controls import controls_heading, controls_table, verdicts
from stages.report_policies import judged, policies_table, win_matrix

CURVES = [
    ("objective/score_raw", "score (raw: RM, or the sum of ppo.rewards)"), ("objective/kl", "KL to reference (nats/response)"),
    ("objective/kl_coef", "beta"), ("policy/entropy", "entropy"), ("response/length_mean", "response length"),
    ("policy/clipfrac", "clip fraction"), ("value/explained_variance", "explained variance"),
    ("objective/gold", "gold score (judge, monitoring only)"),
    ("heldout/reward", "held-out RM score (ppo.eval_every)"), ("heldout/gold", "held-out gold score (ppo.eval_every)"),
]


def curves_png(history: dict[str, list[tuple[int, float]]]) -> str | None:
    """A grid of the PPO curves over iterations, as base64 PNG."""
    plt = _plt()

    # Each reward source's raw score, when PPO had more than the RM alone (`objective/score/<name>`).
    sources = [(k, f"reward source {k.rsplit('/', 1)[1]} (raw)") for k in sorted(history)
               if k.startswith("objective/score/") and history[k]]
    present = [(k, t) for k, t in CURVES if history.get(k)] + sources
    if not present:
        return None
    cols = 4
    rows = (len(present) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, present):
        steps, values = zip(*history[key])
        ax.plot(steps, values, marker="." if len(steps) < 40 else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PPO iteration", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present):]:
        ax.axis("off")
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


def overoptimisation_png(history: dict[str, list[tuple[int, float]]]) -> str | None:
    """Proxy (RM) and gold reward of each iteration's rollout against its KL to the reference: past some KL the
    proxy keeps rising while the gold falls when the policy over-optimises the reward model."""
    plt = _plt()

    kl = dict(history.get("objective/kl", []))
    if not kl:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    # KL is not monotone over the iterations, so points (not a line) and the iteration as the shade.
    series = (("objective/score_raw", "proxy: RM score", "Blues"), ("objective/gold", "gold: judge", "Oranges"))
    for key, label, cmap in series:
        pts = [(kl[s], v, s) for s, v in history.get(key, []) if s in kl]
        if pts:
            x, y, it = zip(*pts)
            ax.scatter(x, y, c=it, cmap=cmap, vmin=-0.3 * max(it), s=14, label=label)
    ax.set_xlabel("KL to reference (nats/response); darker = later iteration")
    ax.set_ylabel("mean reward of the rollout")
    if ax.get_legend_handles_labels()[0]:  # no series without RM scores or gold in the history
        ax.legend()
    ax.grid(alpha=0.3)
    out = _png(fig)
    plt.close(fig)
    return out


def hist_png(series: dict[str, list[float]], xlabel: str, ylabel: str, bins: Any = 30) -> str | None:
    """Overlaid histograms of named series, as base64 PNG; None when every series is empty."""
    if not any(series.values()):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, values in series.items():
        ax.hist(values, bins=bins, alpha=0.5, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    out = _png(fig)
    plt.close(fig)
    return out


def lengths_png(lengths: dict[str, list[float]]) -> str | None:
    """Histogram of response lengths on the held-out prompts, policy vs SFT."""
    top = max((max(v) for v in lengths.values() if v), default=0)
    return hist_png(lengths, "response length (tokens, EOS included)", "responses", range(0, int(top) + 2))


def _img(png: str | None, alt: str) -> str:
    return f'<img alt="{alt}" src="data:image/png;base64,{png}">' if png else f"<p>no data for {alt}</p>"


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c, r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(column: str, v: Any) -> str:
    """A cell's HTML: a multi-turn episode (`*turns` columns, rlhf_lib.envs.format_turns) one turn per line."""
    text = html.escape(_fmt(v))
    return text.replace(" | ", "<br>") if column.endswith("turns") else text


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


NO_JUDGE = "n/a: no gold judge"
SINGLE = [("win rate vs SFT (gold judge)", "win_rate_vs_sft"),
          ("win rate vs SFT (RM-judged: the proxy PPO optimised)", "rm_win_rate_vs_sft"),
          ("reward lead over SFT (paired)", "reward_lead_over_sft"),
          ("KL to SFT (nats/response)", "kl_to_ref"), ("share without EOS", "no_eos_frac"),
          ("RM accuracy on held-out pairs", "reward_model_accuracy"), ("prompts cut on the left", "truncated_prompts")]


def metrics_table(metrics: dict[str, Any], intervals: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    """The held-out metrics, policy next to SFT, each with its 95 % interval. Gold rows say so when the data has
    no judge (user data)."""
    pairs = [("gold reward (judge)", "gold_reward_mean", "gold_reward_mean_sft"),
             ("RM reward", "reward_mean", "reward_mean_sft"),
             ("response length (tokens)", "response_length_mean", "response_length_mean_sft")]
    judged = metrics.get("gold_reward_mean") is not None
    bounds = intervals or {}

    def value(key: str) -> Any:
        if not judged and key in ("gold_reward_mean", "win_rate_vs_sft"):
            return NO_JUDGE
        v = metrics.get(key)
        return with_interval(v, bounds.get(key)) if isinstance(v, float) and key in bounds else v

    # Each reward source of ppo.rewards, when PPO had more than the RM alone (`reward_<name>_mean`).
    sources = sorted(k.removeprefix("reward_").removesuffix("_mean_sft") for k in metrics
                     if k.startswith("reward_") and k.endswith("_mean_sft") and k != "reward_mean_sft")
    if sources:
        pairs[1] = ("reward (weighted sum of the sources)", "reward_mean", "reward_mean_sft")
    pairs += [(f"reward source {name}", f"reward_{name}_mean", f"reward_{name}_mean_sft") for name in sources]
    table = [{"metric": name, "PPO policy": value(a), "SFT": NO_JUDGE if value(a) == NO_JUDGE else value(b)}
             for name, a, b in pairs]
    return table + [{"metric": name, "PPO policy": value(k), "SFT": None} for name, k in SINGLE if k in metrics]


def terms_table(metrics: dict[str, Any], intervals: dict[str, list[float]] | None = None,
                terms: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The gold judge's `terms` one by one (the task's `GoldJudge.terms`): policy, SFT and the difference, with 95 %
    intervals."""
    bounds = intervals or {}
    rows = []
    for term in terms:
        pol, sft = metrics.get(f"gold_{term}_mean"), metrics.get(f"gold_{term}_mean_sft")
        if pol is None or sft is None:
            continue
        lo, hi = bounds.get(f"gold_{term}_delta") or (float("nan"), float("nan"))
        # The paired difference's interval decides: one that spans 0 reads as a tie, not a gain or a loss.
        verdict = "ahead" if lo > 0 else "behind" if hi < 0 else "tie" if lo == lo else ""
        rows.append({"term": term, "PPO policy": with_interval(pol, bounds.get(f"gold_{term}_mean")),
                     "SFT": with_interval(sft, bounds.get(f"gold_{term}_mean_sft")),
                     "PPO - SFT [95 %]": with_interval(pol - sft, bounds.get(f"gold_{term}_delta")),
                     "PPO vs SFT": verdict})
    return rows


def render_html(summary: dict[str, Any], history: dict[str, list[tuple[int, float]]],
                samples: list[dict[str, Any]], lengths: dict[str, list[float]] | None = None,
                alarms: list[str] | None = None) -> str:
    """The report page. `summary` holds `lineage` and `metrics` (policy vs SFT); `alarms` the PPO run's alarms."""
    metrics = summary["metrics"]
    table = metrics_table(metrics, summary.get("intervals"))
    terms = terms_table(metrics, summary.get("intervals"), summary.get("judge_terms", ()))
    terms_html = f"<h2>Gold judge term by term: PPO policy vs SFT</h2>{_table(terms)}" if terms else ""
    lineage = [{"item": k, "value": v} for k, v in summary["lineage"].items()]
    curves = _img(curves_png(history), "PPO curves")
    overopt = _img(overoptimisation_png(history), "proxy and gold reward against KL")
    best_of = baselines_table(metrics, summary.get("intervals"))
    best_of_html = "" if not best_of else (
        f"<h2>PPO against SFT and best-of-n of SFT (first {_fmt(metrics.get('best_of_prompts'))} prompts for "
        f"best-of-n)</h2>{_table(best_of)}"
        f"{_img(overoptimisation_heldout_png(metrics, summary.get('intervals')), 'held-out proxy and judge vs KL')}")
    controls = controls_table(metrics, summary.get("intervals"))
    controls_html = "" if not controls else (
        f"<h2>{controls_heading(metrics)}</h2><ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in verdicts(metrics, summary.get("intervals")))
        + f"</ul>{_table(controls)}")
    policies = policies_table(metrics, summary.get("intervals"), summary.get("training_seconds"))
    matrix = win_matrix(metrics, summary.get("intervals"))
    judge = "the judge" if judged(metrics) else "the reward sources (no judge)"
    policies_html = "" if not (policies and matrix) else (
        f"<h2>Every policy on the same prompts, under {judge}</h2>{_table(policies)}"
        f"<h2>Paired win rates under {judge}: the row's over the column's</h2>{_table(matrix)}")
    hist = _img(lengths_png(lengths or {}), "response lengths")
    alarm_html = ("<ul>" + "".join(f"<li>{html.escape(a)}</li>" for a in alarms) + "</ul>") if alarms else \
        "<p>none raised</p>"
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top;"
             "white-space:pre-wrap}th{background:#f3f3f3}img{max-width:100%}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>RLHF eval report</title><style>{style}</style>"
        f"</head><body><h1>RLHF eval report: {html.escape(str(summary.get('name', '')))}</h1>"
        f"<h2>Lineage</h2>{_table(lineage)}"
        f"<h2>Held-out metrics: PPO policy vs SFT (95 % intervals)</h2>{_table(table)}{terms_html}{policies_html}"
        f"{controls_html}{best_of_html}"
        f"<h2>PPO training curves</h2>{curves}"
        f"<h2>Proxy vs gold reward against KL</h2>{overopt}"
        f"<h2>Response lengths on held-out prompts</h2>{hist}"
        f"<h2>Alarms</h2>{alarm_html}"
        f"<h2>Samples on held-out prompts</h2>{_table(samples)}"
        "</body></html>"
    )
