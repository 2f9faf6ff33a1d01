"""The process environment of a command that runs flows: the state dir and Prefect's and MLflow's settings (set
before Prefect is imported: it reads them at import), the Prefect API (`rlhf up`'s, the configured one, or a
throwaway server started on the other core), and the work done while that server starts."""

from __future__ import annotations

import os
from pathlib import Path

from stages.home import state_dir


def configure_env(use_services: bool = True) -> Path:
    state = state_dir()
    os.environ["RLHF_HOME"] = str(state)
    os.environ.setdefault("PREFECT_HOME", str(state / "prefect"))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect does not create parents
    # The analytics ping makes concurrent server starts fail with "database is locked".
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # transformers' and the hub's tqdm bars ("Loading weights", "Writing model shards") on every model load and save,
    # and MLflow's INFO lines (the store's schema migrations on first use).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if use_services and "PREFECT_API_URL" not in os.environ:
        from services.servers import running_prefect_api

        api = running_prefect_api(state)
        if api:  # `rlhf up` is running: show this run in its UI instead of a throwaway ephemeral server
            os.environ["PREFECT_API_URL"] = api
    return state


def check_prefect(api_url: str, timeout_s: float = 5.0) -> None:
    """Fail within seconds, naming the URL, when the configured Prefect API does not answer (no hang)."""
    from stages.net import require_healthy

    require_healthy(api_url, "Prefect API", "Start it with `rlhf up`, or unset PREFECT_API_URL to use a throwaway "
                    "local server.", timeout_s)


def start_prefect():
    """Make sure a Prefect API is there for this process; returns the settings to run flows under.

    Without `PREFECT_API_URL` (and no `rlhf up`), a throwaway server starts on the other core while this process
    imports torch and Prefect; call `.wait()` on the returned server before the first flow.
    """
    if os.environ.get("PREFECT_API_URL"):
        check_prefect(os.environ["PREFECT_API_URL"])
        return None
    from services.ephemeral import EphemeralPrefect

    server = EphemeralPrefect()
    os.environ["PREFECT_API_URL"] = server.api_url
    return server


def flow_settings(server):
    """Heartbeats let a long-lived server mark crashed runs; the throwaway server dies with this process, so they
    would only cost each sub-flow up to a second at exit."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if server:
        server.wait()  # it stops at exit, after Prefect's own exit hooks have flushed logs and events to it
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None} if server else {})


def warm_up(server, fresh_model: bool) -> None:
    """Work the run needs first, done while the throwaway Prefect server starts on the other core (a fresh database
    migrates for seconds): open the MLflow store, whose fresh SQLite file migrates too; then, if the server is still
    not up and a fresh model will be built, import the GPT-2 classes that transformers otherwise loads at the first
    model build, after the server is up."""
    from stages.tracking import setup_mlflow

    setup_mlflow()
    if server is not None and fresh_model and not server.ready():
        import transformers.models.gpt2.modeling_gpt2  # noqa: F401
