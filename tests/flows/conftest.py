"""Fixtures of the flow tests."""

from __future__ import annotations

import contextlib
import os

import pytest


@pytest.fixture(scope="module")
def home(tmp_path_factory, prefect_server):
    """A fresh state dir (`RLHF_HOME`: MLflow store and artifacts) per test module, on the session's Prefect server."""
    path = tmp_path_factory.mktemp("rlhf-home")
    old = os.environ.get("RLHF_HOME")
    os.environ["RLHF_HOME"] = str(path)
    yield path
    if old is None:
        os.environ.pop("RLHF_HOME", None)
    else:
        os.environ["RLHF_HOME"] = old


@contextlib.contextmanager
def local_services(state, **up_args):
    """`rlhf up`'s services on free ports for one test module, stopped after; yields their URLs."""
    from services import servers as services
    from stages.net import free_port

    mp = pytest.MonkeyPatch()
    mp.setenv("RLHF_PREFECT_PORT", str(free_port()))
    mp.setenv("RLHF_MLFLOW_PORT", str(free_port()))
    mp.delenv("PREFECT_HOME", raising=False)
    try:
        yield services.up(state, timeout_s=180, **up_args)
    finally:
        services.down(state)
        mp.undo()
