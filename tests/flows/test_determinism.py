"""Same seed twice on CPU: the whole pipeline (data, SFT, RM, PPO, eval) gives identical metrics and weights."""

from __future__ import annotations

import os

import pytest
from mlflow import MlflowClient

from cli.main import load_config


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, prefect_server):
    from flows.pipeline import rlhf

    old = os.environ.get("RLHF_HOME")
    summaries = []
    for name in ("a", "b"):
        os.environ["RLHF_HOME"] = str(tmp_path_factory.mktemp(f"determinism-{name}"))
        summaries.append(rlhf(config=load_config("micro", None, []), pipeline="full"))
    if old is None:
        os.environ.pop("RLHF_HOME", None)
    else:
        os.environ["RLHF_HOME"] = old
    return summaries


def test_two_stores_same_seed_same_everything(two_runs):
    a, b = two_runs
    assert a["eval"] == b["eval"]
    for stage in ("data", "sft", "reward", "ppo", "eval"):
        assert a["stages"][stage]["cache_key"] == b["stages"][stage]["cache_key"], stage


def test_same_ppo_curves_and_same_artifact_digests(two_runs):
    a, b = two_runs
    digests = []
    curves = []
    for summary in (a, b):
        uri = summary["mlflow_tracking_uri"]
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        runs = {s: client.get_run(summary["stages"][s]["mlflow_run_id"]) for s in ("sft", "reward", "ppo")}
        digests.append({s: r.data.tags["rlhf.digest"] for s, r in runs.items()})
        ppo = runs["ppo"].info.run_id
        curves.append({k: [m.value for m in sorted(client.get_metric_history(ppo, k), key=lambda m: m.step)]
                       for k in runs["ppo"].data.metrics if not k.startswith(("time/", "system/"))})
    assert digests[0] == digests[1]  # bit-identical weights
    assert curves[0] == curves[1]
