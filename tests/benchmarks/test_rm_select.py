"""`benchmarks/rm_select.py`'s run plumbing (the runs themselves are benchmarks): what each `rlhf run` is given."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

from benchmarks import rm_select


def test_every_run_gets_the_sft_model_and_the_validation_file(tmp_path, monkeypatch):
    seen: list[list[str]] = []

    def fake_run(argv, **kw):  # every run fails: nothing is chosen, nothing reaches the test file
        seen.append(argv)
        return SimpleNamespace(returncode=1, stdout="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    cands = tmp_path / "c.json"
    cands.write_text(json.dumps({"a": ["reward.lr=3e-5"], "b": []}))
    out = tmp_path / "out.json"
    code = rm_select.main(["--preset", "micro", "--validation", "v.jsonl", "--test", "t.jsonl", "--candidates",
                           str(cands), "--home", str(tmp_path / "h"), "--sft-model", "runs:/abc/model",
                           "--set", "reward.baselines=false", "--out", str(out)])
    assert code == 1 and "test" not in json.loads(out.read_text())
    assert len(seen) == 2
    for argv in seen:
        assert argv[argv.index("--sft-model") + 1] == "runs:/abc/model"
        assert "data.eval_preferences=v.jsonl" in argv and "reward.baselines=false" in argv
    assert "reward.lr=3e-5" in seen[0] and "reward.lr=3e-5" not in seen[1]
    assert "error" in json.loads(out.read_text())["candidates"]["a"]["validation"]
    rm_select.main(["--preset", "micro", "--validation", "v.jsonl", "--test", "t.jsonl", "--candidates",
                    str(cands), "--home", str(tmp_path / "h")])
    assert "--sft-model" not in seen[-1]  # a later call without the flag trains its own
