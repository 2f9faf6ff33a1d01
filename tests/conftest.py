"""Test-session environment: nothing leaks into the user's state dir, Prefect or MLflow stores, or the hub."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="rlhf-tests-"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_HOME"] = str(_SESSION_TMP / "prefect")
# Prefect's result storage in a temporary folder, or cache hits leak between test sessions.
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_SESSION_TMP / "prefect-results")
os.environ["PREFECT_UI_ENABLED"] = "false"
# A loaded CI machine can take longer than the default 20 s to start the in-process Prefect server.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
# `make test` runs two workers on CI's two cores (pytest-xdist), each with torch's two threads: OpenMP threads that
# spin while they wait would take the other worker's core (the suite took 25 min of CPU for 14.6 of wall time, its
# torch-heavy tests 1.5-2x their time alone). Waiting threads sleep instead; set before torch loads its OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Deployment servers (`rlhf serve`, `prefect worker start`) started by tests look for runs every second, not every 10
# (Prefect's default, which users keep): a test's deployment run starts without waiting out a poll.
os.environ["PREFECT_RUNNER_POLL_FREQUENCY"] = "1"
os.environ["PREFECT_WORKER_QUERY_SECONDS"] = "1"
# trust_remote_code copies a checkpoint's code into the modules cache; datasets keeps Arrow files in its cache.
os.environ["HF_MODULES_CACHE"] = str(_SESSION_TMP / "hf-modules")
os.environ["HF_DATASETS_CACHE"] = str(_SESSION_TMP / "hf-datasets")
os.environ["RLHF_HOME"] = str(_SESSION_TMP / "rlhf-home")
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("PREFECT_API_URL", None)
Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _no_tracking_uri_leak():
    """Each test starts without MLFLOW_TRACKING_URI: `mlflow.set_tracking_uri` exports it, and a later test's `rlhf`
    child process would log to the earlier test's store (and find its cache hits) instead of its own RLHF_HOME."""
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from rlhf_lib.models import train_tokenizer

    corpus = [f"\n\nHuman: tell me about topic {i}\n\nAssistant: Sure, topic {i} is nice. Thanks!" for i in range(50)]
    return train_tokenizer(corpus, vocab_size=300)


@pytest.fixture()
def tiny_policy(tiny_tokenizer):
    from rlhf_lib.models import build_policy

    return build_policy(tiny_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64, seed=0)


@pytest.fixture(scope="session")
def prefect_server():
    """One temporary Prefect server (Prefect's test harness: a subprocess on a fresh SQLite database) for every in-process
    flow of the session. Each start migrates a new database, about 11 s on a 366 GFLOP/s host and several times that on
    a slow one, so the modules share it; their MLflow stores stay apart (`RLHF_HOME` per module), and so does every
    cache, which lives there. Heartbeats are off as under `rlhf run`'s throwaway server (`cli.main.flow_settings`):
    joining each sub-flow's heartbeat thread costs up to a second at its end, 4 s of a micro pipeline's 11."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120), \
            temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


# The test files that take minutes, first: under `-n 2 --dist loadfile` each file runs whole on one worker, and one
# started last would run alone at the end while the other worker sits idle.
LONGEST_FILES = ("tests/flows/test_learning.py", "tests/stages/test_resume.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        return next((i for i, f in enumerate(LONGEST_FILES) if item.nodeid.startswith(f)), len(LONGEST_FILES))
    items.sort(key=rank)  # stable: every other test keeps its place, each file its order

