"""`rlhf sweep ppo --set ppo.kl_coef=0.02,0.1,0.3 [--set ppo.lr=1e-5,3e-5]`: PPO + eval once per point, all against
the same SFT and reward-model versions, ranked on the held-out figure that chooses the `champion`.

The sweep is a Prefect flow (`rlhf-sweep`). It first runs the pipeline up to the reward model (from the cache when
it is there), then submits every point at once as a flow run of a deployment (`rlhf/eval` by default: data from the
cache, PPO, eval) with those two models pinned by URI, so the points run in parallel across the deployment's workers
and none retrains them; with `here` the points run one after another in this process. Each point's MLflow parent
run is nested under the sweep's run, which holds the ranking; a Prefect table artifact shows it too. The eval stage
moves `rlhf-policy@champion` to a point's policy when it beats the champion's figure, so after the sweep the alias
is on its best point unless an earlier policy scored higher.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from prefect import flow, get_run_logger

from rlhf_lib.config import ConfigError, PipelineConfig

SWEPT = ("ppo.", "eval.")  # what a PPO sweep may vary: the cached SFT and reward model stay fixed


def parse_grid(sets: Sequence[str]) -> tuple[list[str], list[dict[str, str]]]:
    """Split `--set` items into base overrides (one value) and the grid of swept keys (comma-separated values):
    `["ppo.kl_coef=0.02,0.1", "ppo.iterations=4"]` -> (["ppo.iterations=4"], [{"ppo.kl_coef": "0.02"},
    {"ppo.kl_coef": "0.1"}]). A value in brackets or braces (a YAML list or mapping) is never split."""
    base, axes = [], {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value or key=v1,v2,...")
        if "," in value and value.strip()[:1] not in "[{":
            values = [v.strip() for v in value.split(",")]
            if not all(values) or len(set(values)) != len(values):
                raise ConfigError(f"--set {item!r}: expected distinct, non-empty values, e.g. {key}=0.02,0.1,0.3")
            axes[key] = values
        else:
            base.append(item)
    grid = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    return base, grid


def parse_point(text: str) -> dict[str, str]:
    """`--point "ppo.kl_coef=0.02 ppo.lr=1e-5"` -> {"ppo.kl_coef": "0.02", "ppo.lr": "1e-5"}."""
    point = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--point {text!r}: expected space-separated key=value items")
        point[key] = value
    return point


def point_configs(preset: str, config_file: str | None, base: Sequence[str], points: Sequence[dict[str, str]],
                  stage: str = "ppo") -> list[tuple[dict[str, str], PipelineConfig]]:
    """Every point's whole config, each validated before anything is submitted (a bad value names its point)."""
    from flows.settings import load_config

    if stage != "ppo":
        raise ConfigError(f"rlhf sweep {stage}: only ppo can be swept (against one cached SFT and reward model)")
    if not points:
        raise ConfigError("nothing to sweep: give at least one --set key=v1,v2 or --point")
    out = []
    for point in points:
        if bad := [k for k in point if not k.startswith(SWEPT)]:
            raise ConfigError(f"sweep point {point}: {bad} would change the SFT or reward model; a PPO sweep varies "
                              "ppo.* and eval.* keys (set the others once, without commas)")
        try:
            cfg = load_config(preset, config_file, [*base, *(f"{k}={v}" for k, v in point.items())])
        except ConfigError as e:
            raise ConfigError(f"sweep point {point}: {e}") from None
        out.append((point, cfg.model_copy(update={"name": f"{cfg.name}-" + "-".join(f"{k.split('.')[-1]}{v}"
                                                                                  for k, v in point.items())})))
    return out


@flow(name="rlhf-sweep", flow_run_name="sweep-{config.name}")
def sweep(config: PipelineConfig, points: list[dict[str, str]], configs: list[PipelineConfig],
          deployment: str | None = "rlhf/eval", sft_model: str | None = None,
          reward_model: str | None = None) -> dict[str, Any]:
    """Run PPO + eval per point (`configs[i]` is point `points[i]` applied to `config`) against one SFT and reward
    model; returns the ranking. `deployment` None runs the points here, one after another."""
    from flows.pipeline import rlhf
    from flows.sweep_runs import champion_version, nest, point_summary, rank, record, submit_all

    log = get_run_logger()
    upstream = rlhf(config=config, pipeline="reward" if config.ppo.reward_model is not None else "sft",
                    sft_model=sft_model, reward_model=reward_model)
    pinned = {k: s.get("source") or s.get("model_uri") for k, s in upstream["stages"].items() if k in ("sft", "reward")}
    log.info("sweep: %d points against %s", len(points), ", ".join(f"{k} {v}" for k, v in pinned.items()))
    before = champion_version()
    if deployment:
        summaries = submit_all(deployment, configs, pinned, config.resources.pool_timeout_s)
    else:
        summaries = [point_summary(lambda c=c: rlhf(config=c, pipeline="eval", sft_model=pinned.get("sft"),
                                                    reward_model=pinned.get("reward"))) for c in configs]
    rows = rank(points, summaries)
    sweep_run = record(upstream["mlflow_experiment_id"], config, rows, pinned, before)
    nest(summaries, sweep_run)
    done = all(s.get("status") == "completed" for s in summaries)
    return {"status": "completed" if done else "failed", "mlflow_run_id": sweep_run, "upstream": pinned,
            "ranking": rows, "points": summaries}
