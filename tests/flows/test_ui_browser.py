"""Browser checks: after one micro pipeline run, the MLflow and Prefect web UIs, rendered by headless Chromium,
show what the run recorded (parent run, registered policy version, flow run and its stage sub-flows).

The servers are the ones `rlhf up` starts (`services.servers.up`), on free loopback ports in a tmp state dir; the
pipeline runs in-process against that Prefect server and writes to that state dir's MLflow store. Each page's
screenshot is saved in the test's tmp dir (`pytest --basetemp=...` to keep them somewhere handy).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.settings import load_config
from services import servers as services
from stages.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("chromium") is None, reason="Debian's chromium is not installed (apt-get install chromium)")]

STAGES = ["data", "sft", "reward", "ppo", "eval"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,900"]


def _chromium(url: str, shot: Path, budget_ms: int) -> str:
    """Headless Chromium (fresh profile) on `url`: screenshot to `shot`, returns the DOM after `budget_ms` of
    virtual time (without it the single-page apps are still a loading skeleton)."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        out = subprocess.run(
            ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
             f"--screenshot={shot}", "--dump-dom", url],
            capture_output=True, text=True, timeout=120,
        )
    assert out.returncode == 0, f"chromium failed on {url}:\n{out.stderr[-2000:]}"
    return out.stdout


def render(url: str, shot: Path, *expected: str) -> str:
    """The DOM of `url`; rendered again with a longer budget if some `expected` text is missing (slow machines)."""
    dom = _chromium(url, shot, budget_ms=20_000)
    if not all(text in dom for text in expected):
        dom = _chromium(url, shot, budget_ms=60_000)
    return dom


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Prefect + MLflow servers on a fresh state dir, and one micro pipeline run against them:
    {"prefect_ui", "prefect_api", "mlflow_ui", "summary", "flow_run_name"}."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import rlhf

    state = tmp_path_factory.mktemp("rlhf-home")
    prefect_port = free_port()
    with pytest.MonkeyPatch.context() as mp:  # restores RLHF_HOME & co. afterwards
        mp.setenv("RLHF_HOME", str(state))
        mp.setenv("RLHF_HOST", "127.0.0.1")
        mp.setenv("RLHF_PREFECT_PORT", str(prefect_port))
        mp.setenv("RLHF_MLFLOW_PORT", str(free_port()))
        try:
            with pytest.MonkeyPatch.context() as server_env:  # seen only by the servers `up` spawns
                server_env.setenv("PREFECT_UI_ENABLED", "true")  # conftest turns the UI off
                server_env.delenv("PREFECT_HOME", raising=False)  # the server's database under the state dir
                urls = services.up(state, with_serve=False, timeout_s=120)
            with temporary_settings(updates={PREFECT_API_URL: urls["prefect_api"]}):
                summary = rlhf(config=load_config("micro", None, []), pipeline="full")
                with get_client(sync_client=True) as client:
                    flow_run_name = client.read_flow_run(summary["prefect_flow_run_id"]).name
            yield {**urls, "summary": summary, "flow_run_name": flow_run_name}
        finally:
            services.down(state)


def test_mlflow_runs_page_shows_the_parent_run(stack, tmp_path):
    summary = stack["summary"]
    parent = MlflowClient(summary["mlflow_tracking_uri"]).get_run(summary["mlflow_run_id"])
    exp, name = parent.info.experiment_id, parent.info.run_name
    dom = render(f"{stack['mlflow_ui']}/#/experiments/{exp}/runs", tmp_path / "mlflow-runs.png", name)
    assert name in dom
    assert f'href="#/experiments/{exp}/runs/{parent.info.run_id}"' in dom  # the row links to that very run


def test_mlflow_model_page_shows_the_registered_policy_version(stack, tmp_path):
    name, version = stack["summary"]["stages"]["ppo"]["model_uri"].removeprefix("models:/").split("/")
    dom = render(f"{stack['mlflow_ui']}/#/models/{name}", tmp_path / "mlflow-model.png", f"Version {version}")
    assert f'<a href="#/models/{name}/versions/{version}">Version {version}</a>' in dom


def test_prefect_flow_run_page_shows_the_run_and_its_stage_subflows(stack, tmp_path):
    """The default (v1) page draws the sub-flows on a canvas only, and its "Subflow Runs" tab cannot be linked
    to (it is hidden until the run loads, so `?tab=` falls back to Logs); the v2 UI's tab lists them as text."""
    run_id, run_name = stack["summary"]["prefect_flow_run_id"], stack["flow_run_name"]
    dom = render(f"{stack['prefect_ui']}/runs/flow-run/{run_id}", tmp_path / "prefect-flow-run.png", run_name)
    assert run_name in dom and "Completed" in dom

    subflows = [f"{stage}-micro" for stage in STAGES]  # the stage flows' run names: "<stage>-<preset>"
    url = f"{stack['prefect_ui']}/v2/runs/flow-run/{run_id}?tab=SubflowRuns"
    dom = render(url, tmp_path / "prefect-subflows.png", run_name, *subflows)
    assert run_name in dom and "5 Subflow runs" in dom
    for stage, subflow in zip(STAGES, subflows):
        assert f">{stage}<" in dom and f">{subflow}<" in dom, stage  # flow name / run name, both as text
