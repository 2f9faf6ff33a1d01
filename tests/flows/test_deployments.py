"""The deployments as a user drives them, against real services (`rlhf up`: Prefect server, MLflow server and
`rlhf serve --preset micro`): the README's `prefect deployment run` lines run as written; a partial `config`
parameter is merged onto the deployment's preset; data and SFT come from the cache, the reward stage is the named
version, and the PPO run's parameters are the preset's with the one override, in MLflow and in Prefect."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from mlflow import MlflowClient

from flows.settings import load_config
from tests.flows.conftest import local_services

ROOT = Path(__file__).resolve().parents[2]


def readme_deployment_lines() -> list[str]:
    """Every `prefect deployment run` line of the README's code blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [ln.split("  #")[0].strip() for b in blocks for ln in b.splitlines()
            if ln.strip().startswith("prefect deployment run")]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    state = tmp_path_factory.mktemp("deployments")
    with local_services(state, preset="micro") as urls:
        yield state, {**os.environ, "PREFECT_API_URL": urls["prefect_api"], "RLHF_HOME": str(state)}


def _prefect(env: dict, line: str) -> subprocess.CompletedProcess:
    args = shlex.split(line)
    assert args[0] == "prefect"
    return subprocess.run([sys.executable, "-m", "prefect", *args[1:]], env=env, capture_output=True, text=True,
                          timeout=600)


def _api(env: dict, method: str, path: str, body: dict | None = None):
    """One call of the served Prefect REST API (`PREFECT_API_URL`), as JSON: what the client reads, without a
    process of its own per read."""
    response = httpx.request(method, env["PREFECT_API_URL"].rstrip("/") + path, json=body, timeout=60)
    response.raise_for_status()
    return response.json()


def test_readme_deployment_lines_run_and_a_partial_config_changes_one_key(served):
    state, env = served
    lines = readme_deployment_lines()
    assert lines and any('config={"ppo"' in ln for ln in lines), lines
    for line in lines:
        out = _prefect(env, line)
        assert out.returncode == 0 and "Completed" in out.stdout, (line, out.stdout[-2000:], out.stderr[-2000:])

    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf").experiment_id
    runs = client.search_runs([exp], order_by=["attributes.start_time DESC"])
    parent = next(r for r in runs if r.data.tags.get("rlhf.pipeline") == "ppo")  # the README's PPO rerun
    tags = parent.data.tags
    assert (tags["rlhf.cache_hit.data"], tags["rlhf.cache_hit.sft"]) == ("true", "true")
    assert "rlhf.cache_hit.reward" not in tags  # the reward stage is the named model, not a stage run
    ppo = next(r for r in runs if r.data.tags.get("rlhf.stage") == "ppo" and
               r.data.tags.get("mlflow.parentRunId") == parent.info.run_id)
    assert ppo.data.tags["rlhf.upstream.reward"] == "models:/rlhf-reward/1"
    ppo_cfg = load_config("micro", sets=["ppo.lr=1e-4"]).ppo
    # The keys of the cache key (`PPOConfig.key()`: the multi-turn keys only with an environment).
    expected = {k: v for k, v in ppo_cfg.model_dump(mode="json").items() if k in ppo_cfg.key()}
    logged = {k.removeprefix("ppo."): v for k, v in ppo.data.params.items() if k.startswith("ppo.")}
    assert logged == {k: str(v) for k, v in expected.items()}  # the preset's values, with the one override

    flow_run_id = parent.data.tags["rlhf.prefect_flow_run_id"]
    parameters = _api(env, "GET", f"/flow_runs/{flow_run_id}")["parameters"]
    assert parameters["preset"] == "micro"
    assert parameters["config"] == load_config("micro", sets=["ppo.lr=1e-4"]).model_dump(mode="json")


def test_a_bad_key_or_type_is_refused_before_any_run(served):
    _, env = served
    out = _prefect(env, """prefect deployment run rlhf/ppo --param 'config={"ppo": {"lrr": 1}}'""")
    assert out.returncode != 0 and "'lrr' was unexpected" in out.stdout + out.stderr
    out = _prefect(env, """prefect deployment run rlhf/ppo --param 'config={"ppo": {"epochs": "many"}}'""")
    assert out.returncode != 0 and "config.ppo.epochs" in out.stdout + out.stderr


def test_the_deployments_form_shows_the_presets_values(served):
    _, env = served
    params = _api(env, "GET", "/deployments/name/rlhf/ppo")["parameters"]
    assert params["preset"] == "micro" and params["config"] == load_config("micro").model_dump(mode="json")


def _last_flow_run_state(env: dict) -> list:
    run = _api(env, "POST", "/flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 1})[0]
    return [run["state"]["type"], run["state"]["message"]]


def test_a_deployment_run_may_name_code_only_where_the_host_allows_it(served):
    """Parameters are data: `trust_remote_code` and function rewards through the Prefect API are refused before
    any stage, naming the key; the host's own allow-list (<state>/allow-code.txt) lets them through."""
    state, env = served
    for param in ('{"model": {"trust_remote_code": true}}',
                  '{"ppo": {"rewards": [{"name": "x", "kind": "function", "function": "os:system"}]}}'):
        out = _prefect(env, f"prefect deployment run rlhf/sft --param 'config={param}' --watch")
        assert out.returncode != 0, out.stdout[-2000:]
        kind, message = _last_flow_run_state(env)
        assert kind == "FAILED" and "a deployment run may not name code to run" in message, message
    assert "os:system" in message and "allow-code.txt" in message
    (state / "allow-code.txt").write_text("# this host runs checkpoints' own code\nmodel.trust_remote_code\n")
    out = _prefect(env, """prefect deployment run rlhf/sft --param 'config={"model": {"trust_remote_code": true}}' """
                        "--watch")
    assert out.returncode == 0 and "Completed" in out.stdout, out.stdout[-2000:]
    (state / "allow-code.txt").unlink()


def test_a_deployment_run_reads_only_under_the_hosts_roots(served, tmp_path):
    """Issue 55's experiments through `prefect deployment run`: `data.sft=text` with `data.hub_data_dir=<a folder>`
    (datasets' text builder read every file of it into the SFT artifact), a model or SFT URI naming a worker path, a
    preset that is a path: each is refused before any stage, naming the key, and no pipeline run reaches MLflow."""
    state, env = served
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "credentials").write_text("aws_secret_access_key = AKIAFAKEFAKEFAKE\n")
    (tmp_path / "evil.yaml").write_text("name: evil\n")
    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf").experiment_id
    before = len(client.search_runs([exp]))
    data = {"preferences": "json", "sft": "text", "prompts": "text", "hub_data_dir": str(secret)}
    cases = [(f"rlhf/sft --param 'config={json.dumps({'data': data})}'", "data.sft='text'"),
             (f"rlhf/sft --param 'config={json.dumps({'model': {'name_or_path': str(secret)}})}'",
              "model.name_or_path="),
             (f"rlhf/ppo --param sft_model=file://{secret}", "sft_model='file://"),
             (f"rlhf/sft --param preset={tmp_path / 'evil'}", "unknown preset")]
    for args, named in cases:
        out = _prefect(env, f"prefect deployment run {args} --watch")
        assert out.returncode != 0, out.stdout[-2000:]
        kind, message = _last_flow_run_state(env)
        assert kind == "FAILED" and named in message, message
    assert len(client.search_runs([exp])) == before  # refused before the pipeline's MLflow run exists
    assert "AKIAFAKE" not in "".join(p.read_text(errors="replace") for p in state.rglob("*.jsonl"))


def test_the_demo_ends_with_its_figures_and_where_to_look(served):
    """`make demo`'s last lines (`cli.demo.run_demo`, here on the micro preset): the short table of held-out
    figures with intervals, the report's local path (a file that exists) and its MLflow page, the MLflow run, the
    Prefect flow run; no dump of the parameters."""
    state, env = served
    code = ("import sys\nfrom pathlib import Path\nfrom cli.demo import run_demo\nfrom services.servers import urls\n"
            f"sys.exit(run_demo(urls(Path({str(state)!r}))))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stdout.splitlines()
    start = lines.index("held-out figures (95 % intervals):")
    assert lines[start + 1].split()[:5] == ["reward", "model:", "held-out", "pair", "accuracy"]
    assert re.search(r"PPO vs SFT: gold judge's win rate +[0-9.]+ \[[0-9.]+, [0-9.]+\]", out.stdout), out.stdout
    reports = [ln.split(None, 1)[1] for ln in lines if ln.startswith("report:")]
    assert Path(reports[0]).is_file() and reports[0].endswith("report/report.html"), reports
    assert reports[1].startswith("http://127.0.0.1:") and reports[1].endswith("/artifacts/report/report.html")
    assert any(ln.startswith("MLflow:  http://127.0.0.1:") for ln in lines)
    assert any(ln.startswith("Prefect: http://127.0.0.1:") for ln in lines)
    assert '"parameters"' not in out.stdout and lines[-1] == "Stop the services with `make down`."
