"""Every shipped preset is a valid config; the real-size ones name a hub policy and hub data."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import load_config

PRESETS = sorted(p.stem for p in (Path(__file__).parents[2] / "flows" / "presets").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_a_valid_config(name):
    cfg = load_config(name, None, [])
    assert cfg.name == name
    if name not in ("demo", "micro"):
        assert cfg.model.name_or_path and cfg.data.preferences and cfg.data.eval_preferences
        assert not cfg.model.trust_remote_code  # no preset runs a checkpoint's code
