"""The eval report's baselines section: PPO next to SFT and best-of-n sampling from SFT (`eval.best_of`), each with
its KL to SFT, its proxy reward (what PPO optimised) and its judge reward (a judge PPO never optimised), and PPO's win
rates against each. Read against KL, the two rewards are the over-optimisation picture of Gao et al. 2023: the proxy
climbs with KL whatever happens; the judge says whether the climb is real."""

from __future__ import annotations

from typing import Any

from rlhf_lib.intervals import with_interval
from stages.plotting import png, pyplot

NA = "n/a"


def _get(metrics: dict[str, Any], bounds: dict[str, Any], key: str) -> Any:
    v = metrics.get(key)
    if v is None:
        return NA
    return with_interval(v, bounds.get(key)) if isinstance(v, float) and key in bounds else v


def best_of_ns(metrics: dict[str, Any]) -> list[int]:
    """The n of every best-of-n baseline the eval measured, ascending."""
    return sorted(int(k.removeprefix("best_of_").removesuffix("_kl")) for k in metrics
                  if k.startswith("best_of_") and k.endswith("_kl"))


def baselines_table(metrics: dict[str, Any], intervals: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row each for SFT, every best-of-n and PPO: KL to SFT, judge and proxy reward, response length, and PPO's
    win rates against the row (judge, then proxy), with 95 % intervals. Empty without best-of-n baselines."""
    ns = best_of_ns(metrics)
    if not ns:
        return []
    b = intervals or {}

    def row(name: str, kl: str | float, gold: str, proxy: str, length: str, win: str | None,
            rm_win: str | None) -> dict:
        return {"policy": name, "KL to SFT (nats)": kl if isinstance(kl, float) else _get(metrics, b, kl),
                "judge reward": _get(metrics, b, gold),
                "proxy reward (RM, optimised)": _get(metrics, b, proxy),
                "response length": _get(metrics, b, length),
                "PPO's judge win rate vs it": _get(metrics, b, win) if win else "",
                "PPO's proxy win rate vs it": _get(metrics, b, rm_win) if rm_win else ""}

    rows = [row("SFT", 0.0, "gold_reward_mean_sft", "reward_mean_sft", "response_length_mean_sft", "win_rate_vs_sft",
                "rm_win_rate_vs_sft")]
    rows += [row(f"best-of-{n} of SFT", f"best_of_{n}_kl", f"best_of_{n}_gold_mean", f"best_of_{n}_reward_mean",
                 f"best_of_{n}_response_length_mean", f"win_rate_vs_best_of_{n}", f"rm_win_rate_vs_best_of_{n}")
             for n in ns]
    rows.append(row("PPO", "kl_to_ref", "gold_reward_mean", "reward_mean", "response_length_mean", None, None))
    return rows


def overoptimisation_heldout_png(metrics: dict[str, Any], intervals: dict[str, Any] | None = None) -> str | None:
    """Proxy and judge reward of SFT, best-of-n and PPO on the held-out prompts against their KL to SFT (two panels,
    95 % intervals as error bars), as base64 PNG; None without best-of-n baselines."""
    ns = best_of_ns(metrics)
    if not ns:
        return None
    b = intervals or {}
    points = [("SFT", 0.0, "reward_mean_sft", "gold_reward_mean_sft")]
    points += [(f"best-of-{n}", metrics[f"best_of_{n}_kl"], f"best_of_{n}_reward_mean", f"best_of_{n}_gold_mean")
               for n in ns]
    points.append(("PPO", metrics.get("kl_to_ref"), "reward_mean", "gold_reward_mean"))
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, col, title in ((axes[0], 2, "proxy: the RM PPO optimised"), (axes[1], 3, "judge: never optimised")):
        for name, kl, *keys in points:
            v = metrics.get(keys[col - 2])
            if v is None or kl is None:
                continue
            lo, hi = b.get(keys[col - 2]) or (v, v)
            ax.errorbar([kl], [v], yerr=[[v - lo], [hi - v]], fmt="o", capsize=3, label=name)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("KL to SFT (nats/response)")
        ax.set_ylabel("mean reward, held-out prompts")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = png(fig)
    plt.close(fig)
    return out
