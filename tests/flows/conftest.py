"""Fixtures of the flow tests."""

from __future__ import annotations

import os

import pytest
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A fresh state dir (`RLHF_HOME`: MLflow store and artifacts) and a temporary Prefect server, per test module."""
    path = tmp_path_factory.mktemp("rlhf-home")
    old = os.environ.get("RLHF_HOME")
    os.environ["RLHF_HOME"] = str(path)
    with prefect_test_harness(server_startup_timeout=120):
        yield path
    if old is None:
        os.environ.pop("RLHF_HOME", None)
    else:
        os.environ["RLHF_HOME"] = old
