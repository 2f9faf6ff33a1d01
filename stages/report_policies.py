"""The eval report's policies section: every policy the eval sampled (SFT, best-of-n of SFT, PPO, the DPO policy,
PPO's control arms) in one table under the same judge, with its KL to SFT, length and the wall time of the stage that
trained it, and a matrix of the judge's paired win rates of each trained policy over every other (95 % intervals, a
bootstrap over prompts with a repeated prompt's replies together). Without a judge the reward sources judge, and the
headings say so. Read from the eval's figures alone (`rlhf_lib.eval`, `rlhf_lib.eval_pairs`)."""

from __future__ import annotations

from typing import Any

from rlhf_lib.intervals import with_interval
from stages.report_best_of import NA, _get, best_of_ns
from stages.report_controls import LABELS

# (label, metric prefix of its own figures) of the trained arms after PPO, in the order the eval samples them
ARMS = ("dpo", "zero_reward", "shuffled_reward")


def arms(metrics: dict[str, Any]) -> list[str]:
    """The arms besides PPO that the eval sampled (the DPO policy, then the controls)."""
    return [a for a in ARMS if f"{a}_reward_mean" in metrics]


def judged(metrics: dict[str, Any]) -> bool:
    """Whether a judge scored the replies (gold figures), else the reward sources decide the win rates."""
    return metrics.get("win_rate_vs_sft") is not None


def _label(name: str) -> str:
    return {"ppo": "PPO", "sft": "SFT"}.get(name) or (f"best-of-{name[8:]} of SFT" if name.startswith("best_of_")
                                                      else LABELS[name])


def win_cell(metrics: dict[str, Any], bounds: dict[str, Any], row: str, col: str) -> str:
    """The win rate of policy `row` over policy `col` (names: ppo, sft, best_of_<n>, dpo, a control), with its
    interval: the eval's figure where it measured that direction, else 1 - the other direction's (ties count half on
    both sides, so the two add up to 1), else n/a."""
    rm = "" if judged(metrics) else "rm_"
    lead = "" if row == "ppo" else f"{row}_"
    if col == "ppo":
        return _complement(metrics, bounds, f"{rm}win_rate_vs_{row}")
    key = f"{lead}{rm}win_rate_vs_{col}"
    if key in metrics or col in ("sft",) or col.startswith("best_of_"):
        return _get(metrics, bounds, key)
    return _complement(metrics, bounds, f"{col}_{rm}win_rate_vs_{row}")


def _complement(metrics: dict[str, Any], bounds: dict[str, Any], key: str) -> str:
    v = metrics.get(key)
    if v is None:
        return NA
    lo, hi = bounds.get(key) or (float("nan"), float("nan"))
    return with_interval(1.0 - v, (1.0 - hi, 1.0 - lo))  # "0.3", not 0.30000000000000004, without an interval


def policies_table(metrics: dict[str, Any], intervals: dict[str, Any] | None = None,
                   seconds: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per sampled policy: KL to SFT (nats), judge and proxy reward, response length, the judge's win rate
    over SFT, and the minutes of the stage that trained it (best-of-n trains nothing: its cost is n samples per
    prompt). Empty when the eval sampled no policy beside PPO and no best-of-n."""
    b, s = intervals or {}, seconds or {}
    names = arms(metrics)
    ns = best_of_ns(metrics)
    if not names and not ns:
        return []

    def minutes(name: str) -> str:
        if name not in s:
            return NA
        m = s[name] / 60
        return f"{m:.1f}" if m >= 1 else f"{m:.2g}"

    def row(label: str, kl: Any, gold: str, proxy: str, length: str, win: str | None, cost: str) -> dict:
        return {"policy": label, "KL to SFT (nats)": kl if isinstance(kl, float) else _get(metrics, b, kl),
                "judge reward": _get(metrics, b, gold), "proxy reward (RM)": _get(metrics, b, proxy),
                "response length": _get(metrics, b, length),
                "judge win rate vs SFT": _get(metrics, b, win) if win else "", "training (min)": cost}

    rows = [row("SFT", 0.0, "gold_reward_mean_sft", "reward_mean_sft", "response_length_mean_sft", None,
                minutes("sft"))]
    rows += [row(_label(f"best_of_{n}"), f"best_of_{n}_kl", f"best_of_{n}_gold_mean", f"best_of_{n}_reward_mean",
                 f"best_of_{n}_response_length_mean", None, f"none ({n} samples a prompt)") for n in ns]
    rows.append(row("PPO", "kl_to_ref", "gold_reward_mean", "reward_mean", "response_length_mean", "win_rate_vs_sft",
                    minutes("ppo")))
    rows += [row(_label(a), f"{a}_kl_to_ref", f"{a}_gold_reward_mean", f"{a}_reward_mean",
                 f"{a}_response_length_mean", f"{a}_win_rate_vs_sft", minutes(a)) for a in names]
    return rows


def win_matrix(metrics: dict[str, Any], intervals: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rows: PPO and each other trained policy; columns: SFT, each best-of-n, and every trained policy. A cell is the
    row's win rate over the column on the same prompts (best-of-n: the first `eval.best_of_prompts`). Empty with no
    trained policy beside PPO."""
    names = arms(metrics)
    if not names:
        return []
    b = intervals or {}
    trained = ["ppo", *names]
    cols = ["sft", *(f"best_of_{n}" for n in best_of_ns(metrics)), *trained]
    return [{"win rate of ↓ over →": _label(r)} | {_label(c): ("" if c == r else win_cell(metrics, b, r, c))
                                                   for c in cols} for r in trained]
