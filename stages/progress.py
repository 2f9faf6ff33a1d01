"""Progress of long work, for whoever shows it (the `rlhf run` terminal display): stages report steps of their
training loops here; with no reporter set (deployments, tests) reporting costs nothing."""

from __future__ import annotations

from collections.abc import Callable

# reporter(stage, step, total, figures): `step` of `total` done, with a few key figures of the last step.
Reporter = Callable[[str, int, int, dict[str, float]], None]
_reporter: Reporter | None = None

# The figures shown for each stage, by metric name, and their short labels.
FIGURES = {
    "sft": {"sft/loss_ema": "loss"},
    "reward": {"reward/loss": "loss", "reward/train_accuracy_ema": "acc"},
    "dpo": {"dpo/loss_ema": "loss", "rewards/accuracies": "acc"},
    "ppo": {"objective/score_raw": "score", "objective/kl": "kl", "response/length_mean": "len",
            "objective/gold": "gold"},
}


def set_reporter(reporter: Reporter | None) -> None:
    global _reporter
    _reporter = reporter


def report(stage: str, step: int, total: int, metrics: dict[str, float]) -> None:
    if _reporter is not None:
        figures = {label: metrics[key] for key, label in FIGURES.get(stage, {}).items() if key in metrics}
        _reporter(stage, step, total, figures)
