"""The reward model's report card on held-out pairs, before any PPO is spent on it (RewardBench's questions):
how often it is right (with a 95 % interval), whether it is surer when it is right (accuracy by margin), where it is
right (by the gold judge's term on the demo task, by `category` on user data), how its scores of chosen and rejected
responses are spread, and its most confident mistakes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlhf_lib.data.records import PairExample
from rlhf_lib.intervals import proportion_interval

Terms = Callable[[str, str], dict[str, float]]


def _accuracy(right: np.ndarray) -> dict[str, Any]:
    n, k = int(right.size), int(right.sum())
    return {"pairs": n, "accuracy": k / n if n else float("nan"), "ci95": list(proportion_interval(k, n))}


def rm_report(pairs: Sequence[PairExample], chosen: Sequence[float], rejected: Sequence[float],
              terms: Terms | None = None, bins: int = 4, mistakes: int = 5) -> dict[str, Any]:
    """The report of an RM that scored `chosen[i]` and `rejected[i]` for `pairs[i]` (a tie counts as wrong).

    by_margin: the pairs in `bins` quantile bins of |score margin|, least sure first. by_term (with `terms`, the
    judge's breakdown): the pairs whose chosen and rejected responses differ in that term. by_category: per
    `PairExample.category`, when the data has one. JSON-able.
    """
    c, r = np.asarray(chosen, dtype=np.float64), np.asarray(rejected, dtype=np.float64)
    right = c > r
    margin = np.abs(c - r)
    out: dict[str, Any] = _accuracy(right)
    edges = np.quantile(margin, np.linspace(0, 1, bins + 1)) if margin.size else np.zeros(bins + 1)
    which = np.clip(np.searchsorted(edges, margin, side="right") - 1, 0, bins - 1)
    out["by_margin"] = [{"margin": f"{edges[b]:.3g} to {edges[b + 1]:.3g}", **_accuracy(right[which == b])}
                        for b in range(bins) if (which == b).any()]
    if terms is not None and pairs:
        tc = [terms(p.prompt, p.chosen) for p in pairs]
        tr = [terms(p.prompt, p.rejected) for p in pairs]
        out["by_term"] = [{"term": t, **_accuracy(right[np.array([a[t] != b[t] for a, b in zip(tc, tr)])])}
                          for t in tc[0]]
    categories = sorted({p.category for p in pairs if p.category})
    if categories:
        cat = np.array([p.category or "" for p in pairs])
        out["by_category"] = [{"category": k, **_accuracy(right[cat == k])} for k in categories]
    out["scores"] = {name: {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()),
                            "max": float(v.max())} for name, v in (("chosen", c), ("rejected", r)) if v.size}
    worst = np.argsort(c - r)[: min(mistakes, int((~right).sum()))]
    out["mistakes"] = [{"prompt": pairs[i].prompt, "chosen": pairs[i].chosen, "rejected": pairs[i].rejected,
                        "chosen_score": float(c[i]), "rejected_score": float(r[i]),
                        **({"category": pairs[i].category} if pairs[i].category else {})} for i in worst]
    return out


def adversarial_report(pairs: Sequence[PairExample], right: Sequence[bool], floor: float = 0.8,
                       worst: int = 5) -> dict[str, Any]:
    """Accuracy on the demo task's adversarial minimal pairs (`rlhf_lib.demo_task.adversarial`), whose `category`
    is the kind (`loop`, `cut`, ...) or `topic:<prompt topic>><other topic>`.

    by_kind: each kind with its 95 % interval; topic_pairs: every (prompt topic, other topic), worst first (ties by
    name); `weak_topic_pairs`: how many score under `floor`; `worst_topic_pairs`: the first `worst`. JSON-able.
    """
    ok = np.asarray(right, dtype=bool)
    cats = np.array([p.category or "" for p in pairs])
    kinds = np.array([c.split(":", 1)[0] for c in cats])
    out: dict[str, Any] = _accuracy(ok)
    out["by_kind"] = [{"kind": k, **_accuracy(ok[kinds == k])} for k in dict.fromkeys(kinds.tolist())]
    topic = [c.split(":", 1)[1] for c in dict.fromkeys(cats[kinds == "topic"].tolist())]
    rows = [{"topic_pair": t.replace(">", " vs "), **_accuracy(ok[cats == f"topic:{t}"])} for t in topic]
    rows.sort(key=lambda r: (r["accuracy"], r["topic_pair"]))
    out["topic_pairs"] = rows
    out["weak_topic_pairs"] = sum(r["accuracy"] < floor for r in rows)
    out["floor"] = floor
    out["worst_topic_pairs"] = rows[:worst]
    return out


def adversarial_metrics(report: dict[str, Any], prefix: str = "reward/adversarial") -> dict[str, float]:
    """The MLflow metrics of `adversarial_report`."""
    out = {f"{prefix}_accuracy": report["accuracy"]}
    out |= {f"{prefix}/{k['kind']}_accuracy": k["accuracy"] for k in report["by_kind"]}
    if report["topic_pairs"]:
        out[f"{prefix}/worst_topic_pair_accuracy"] = report["topic_pairs"][0]["accuracy"]
        out[f"{prefix}/weak_topic_pairs"] = float(report["weak_topic_pairs"])
    return out
