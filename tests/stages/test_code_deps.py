"""Cache keys cover the code a stage runs, found from its imports (stages/code_deps.py): every project module a stage
imports, directly or not, is in its key; benchmark and test code is in none; a changed file changes the key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stages import cache, code_deps
from stages.code_deps import ROOT, dependencies, source_files

STAGES = ("data", "sft", "reward", "ppo", "eval")


@pytest.mark.parametrize("stage", STAGES)
def test_every_project_module_the_stage_loads_is_in_its_key(stage):
    # What Python itself loads when the stage module is imported, in a fresh interpreter: all of it must be covered.
    code = (f"import sys, json, stages.{stage}\n"
            "print(json.dumps(sorted(m for m in sys.modules\n"
            "                        if m.split('.')[0] in ('rlhf_lib', 'stages', 'flows', 'services', 'cli'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       cwd=ROOT).stdout)
    assert set(loaded) - dependencies(f"stages.{stage}") == set()


def test_imports_inside_functions_count():
    # ptx.ptx_loss imports rlhf_lib.sft inside the function; rlhf_lib.sft imports rlhf_lib.lm.scoring.
    assert "rlhf_lib.sft" in dependencies("stages.ppo")
    assert "rlhf_lib.lm.scoring" in dependencies("stages.sft")
    assert {"rlhf_lib.lm.scoring", "rlhf_lib.ppo.trainer"} & dependencies("stages.data") == set()


@pytest.mark.parametrize("stage", STAGES)
def test_no_benchmark_or_test_code_is_in_a_key(stage):
    files = [f.relative_to(ROOT).parts[0] for f in source_files(f"stages.{stage}")]
    assert set(files) <= {"rlhf_lib", "stages"}, set(files)


def test_relative_and_package_imports_resolve(tmp_path, monkeypatch):
    pkg = tmp_path / "stages" / "fake"
    pkg.mkdir(parents=True)
    (tmp_path / "stages" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (pkg / "b.py").write_text("import os\nfrom stages.fake import c as _c\n")
    (pkg / "c.py").write_text("")
    monkeypatch.setattr(code_deps, "ROOT", tmp_path)
    code_deps.module_file.cache_clear()
    code_deps.dependencies.cache_clear()
    try:
        assert dependencies("stages.fake.a") == {"stages", "stages.fake", "stages.fake.a", "stages.fake.b",
                                                 "stages.fake.c"}
    finally:
        code_deps.module_file.cache_clear()
        code_deps.dependencies.cache_clear()


def test_a_changed_source_file_changes_the_stage_key(tmp_path, monkeypatch):
    # A copy of the SFT stage's sources: a comment added to one of them is a new key.
    files = []
    for f in source_files("stages.sft"):
        copy = tmp_path / f.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(f.read_bytes())
        files.append(copy)
    monkeypatch.setattr(cache, "ROOT", tmp_path)
    monkeypatch.setattr(cache, "source_files", lambda module: files)
    before = cache.code_version.__wrapped__("sft")
    scoring = tmp_path / "rlhf_lib" / "lm" / "scoring.py"
    scoring.write_bytes(scoring.read_bytes() + b"# a comment\n")
    assert cache.code_version.__wrapped__("sft") != before
