"""The services' environment: the hub's offline switch `make demo` set is not inherited (the services outlive the demo
and serve hub runs), one the user set is; nothing is started here."""

from __future__ import annotations

from pathlib import Path

import pytest

from services import servers as services
from services.procs import child_env

MAKE_DEMO = {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1", "RLHF_OFFLINE_FROM_MAKE": "HF_HUB_OFFLINE"}


def _envs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, environ: dict[str, str]) -> dict[str, dict[str, str]]:
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "RLHF_OFFLINE_FROM_MAKE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    specs = services._services(tmp_path, services._endpoints())
    return {name: child_env(svc, environ) for name, svc in specs.items()}


def test_make_demos_offline_switch_is_not_inherited(monkeypatch, tmp_path):
    for name, env in _envs(monkeypatch, tmp_path, MAKE_DEMO).items():
        assert "HF_HUB_OFFLINE" not in env and "RLHF_OFFLINE_FROM_MAKE" not in env, name
        assert env["PATH"] == "/usr/bin"
    assert _envs(monkeypatch, tmp_path, MAKE_DEMO)["serve"]["RLHF_HOME"] == str(tmp_path.resolve())


def test_a_switch_the_user_set_stays(monkeypatch, tmp_path):
    # `make demo` with the user's own HF_HUB_OFFLINE sets no marker (Makefile: ifndef); tests set it in conftest.
    user = {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for env in _envs(monkeypatch, tmp_path, user).values():
        assert env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"


def test_only_the_named_switches_go():
    environ = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RLHF_OFFLINE_FROM_MAKE": "HF_HUB_OFFLINE PATH"}
    assert services.inherited_offline(environ) == ("HF_HUB_OFFLINE", "RLHF_OFFLINE_FROM_MAKE")
    assert services.inherited_offline({"HF_HUB_OFFLINE": "1"}) == ()


def test_the_makefile_sets_the_switch_for_the_tests_and_demo_only():
    text = (Path(__file__).parents[2] / "Makefile").read_text()
    assert "export HF_HUB_OFFLINE" not in text.replace("test test-all demo: export HF_HUB_OFFLINE", "")
    assert "demo: export RLHF_OFFLINE_FROM_MAKE := HF_HUB_OFFLINE" in text
