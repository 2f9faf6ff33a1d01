"""The eval report's controls section: PPO beside each of its control arms (`eval.controls`: the same PPO run with
the reward sources' score replaced by 0, or permuted within each rollout) and, with `dpo.enabled`, beside the DPO
policy. What a control reaches is what the shaping (missing-EOS penalty, KL, whitening) teaches without the reward;
PPO's paired lead over it, with its interval, is what the reward taught beyond that. The DPO policy learned from the
same preference pairs with no reward model and no sampling: PPO's lead over it is what the RM and PPO's own samples
bought over DPO."""

from __future__ import annotations

from typing import Any

from stages.report_best_of import NA, _get

LABELS = {"zero_reward": "zero-reward control", "shuffled_reward": "shuffled-reward control", "dpo": "DPO policy"}
# What PPO's lead over an arm means, by arm: the controls' is the reward's share, DPO's the RM's and sampling's.
MEANING = {"dpo": ("the reward model and sampling bought more than DPO on the same pairs",
                   "DPO on the same pairs did better than the reward model and PPO")}
CONTROL_MEANING = ("the reward taught more than the shaping", "the shaping alone did better than the reward")


def control_names(metrics: dict[str, Any]) -> list[str]:
    """The arms the eval measured (control arms, then the DPO policy), in a fixed order."""
    return [name for name in LABELS if f"reward_lead_over_{name}" in metrics]


def controls_heading(metrics: dict[str, Any]) -> str:
    """The section's title, naming the arms it holds."""
    names = control_names(metrics)
    parts = (["its control arms (the same run, the reward replaced): what the reward taught beyond the shaping"]
             if any(n != "dpo" for n in names) else [])
    parts += ["the DPO policy (the same pairs, no reward model, no sampling)"] if "dpo" in names else []
    return "PPO against " + "; and ".join(parts)


def controls_table(metrics: dict[str, Any], intervals: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per control arm and one for PPO: KL to SFT, judge and proxy reward, length, the judge's win rate over
    SFT, and PPO's paired lead over the arm (judge, proxy) and win rates against it, each with its 95 % interval
    (a bootstrap over prompts, a repeated prompt's replies together). Empty without controls."""
    names = control_names(metrics)
    if not names:
        return []
    b = intervals or {}
    rows = [{"policy": "PPO", "KL to SFT (nats)": _get(metrics, b, "kl_to_ref"),
             "judge reward": _get(metrics, b, "gold_reward_mean"), "proxy reward": _get(metrics, b, "reward_mean"),
             "response length": _get(metrics, b, "response_length_mean"),
             "judge win rate vs SFT": _get(metrics, b, "win_rate_vs_sft"),
             "PPO - it, judge": "", "PPO - it, proxy": "", "PPO's judge win rate vs it": ""}]
    for name in names:
        rows.append({"policy": LABELS[name], "KL to SFT (nats)": _get(metrics, b, f"{name}_kl_to_ref"),
                     "judge reward": _get(metrics, b, f"{name}_gold_reward_mean"),
                     "proxy reward": _get(metrics, b, f"{name}_reward_mean"),
                     "response length": _get(metrics, b, f"{name}_response_length_mean"),
                     "judge win rate vs SFT": _get(metrics, b, f"{name}_win_rate_vs_sft"),
                     "PPO - it, judge": _get(metrics, b, f"gold_lead_over_{name}"),
                     "PPO - it, proxy": _get(metrics, b, f"reward_lead_over_{name}"),
                     "PPO's judge win rate vs it": _get(metrics, b, f"win_rate_vs_{name}")})
    return rows


def verdicts(metrics: dict[str, Any], intervals: dict[str, Any] | None = None) -> list[str]:
    """One line per arm: whether PPO's lead over it (judge where there is one, else the reward sources) has an
    interval above 0, and what that means for this arm."""
    b, out = intervals or {}, []
    for name in control_names(metrics):
        key = f"gold_lead_over_{name}" if metrics.get(f"gold_lead_over_{name}") is not None else \
            f"reward_lead_over_{name}"
        lo, hi = b.get(key) or (float("nan"), float("nan"))
        what = "the judge" if key.startswith("gold") else "the reward sources"
        ahead, behind = MEANING.get(name, CONTROL_MEANING)
        if lo > 0:
            out.append(f"PPO beats the {LABELS[name]} under {what} (interval above 0): {ahead}")
        elif hi < 0:
            out.append(f"the {LABELS[name]} beats PPO under {what}: {behind}")
        elif lo == lo:
            out.append(f"PPO and the {LABELS[name]} cannot be told apart under {what} (interval across 0)")
        else:
            out.append(f"PPO vs the {LABELS[name]}: {NA}")
    return out
