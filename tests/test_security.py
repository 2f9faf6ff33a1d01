"""No pickle on the load paths: weights and checkpoints are safetensors; any torch.load must be weights_only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = ("rlhf_lib", "stages", "flows", "services", "cli")  # the code that runs in the pipeline and its servers


def _sources():
    for pkg in PACKAGES:
        yield from (ROOT / pkg).rglob("*.py")


def test_no_pickle_load_anywhere():
    hits = [f"{p}:{i}" for p in _sources() for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"\bpickle\.loads?\(|\bcPickle\b|\bdill\b", line)]
    assert hits == []


def test_no_bare_torch_load():
    hits = [f"{p}:{i}" for p in _sources() for i, line in enumerate(p.read_text().splitlines(), 1)
            if "torch.load(" in line and "weights_only=True" not in line]
    assert hits == []


def test_no_trust_remote_code_by_default():
    hits = [f"{p}:{i}" for p in _sources() for i, line in enumerate(p.read_text().splitlines(), 1)
            if "trust_remote_code=True" in line]
    assert hits == []
