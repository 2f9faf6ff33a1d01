from __future__ import annotations

import threading
import time

from stages.base import key_lock


def test_key_lock_serialises_the_same_key(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    order: list[str] = []
    inside = threading.Event()

    def first():
        with key_lock("sft", "k1"):
            order.append("first in")
            inside.set()
            time.sleep(0.3)
            order.append("first out")

    def second():
        inside.wait()
        with key_lock("sft", "k1"):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == ["first in", "first out", "second in"]


def test_key_lock_does_not_block_other_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    with key_lock("sft", "k1"):
        done = threading.Event()
        t = threading.Thread(target=lambda: (key_lock("sft", "k2").__enter__(), done.set()))
        t.start()
        assert done.wait(5)


def test_a_stage_that_fails_after_registering_leaves_nothing_registered_or_cached(tmp_path, monkeypatch):
    """Fault injection at the last step of publishing (the tag that marks the run complete): the version registered
    a moment before is deleted, the run ends FAILED, and the next attempt trains again and registers once."""
    import mlflow
    import pytest
    from mlflow import MlflowClient
    from prefect import flow

    from stages import base
    from stages.tracking import StageRun, setup_mlflow

    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    monkeypatch.setattr(base, "_IO", {**base._IO, "retries": 0})
    builds = []

    def build(run, out_dir):
        builds.append(1)
        (out_dir / "weights.txt").write_text("trained")

    real_set_tags = StageRun.set_tags

    def failing_set_tags(self, tags):
        if "rlhf.cache_key" in tags:
            raise RuntimeError("store went away while marking the run complete")
        real_set_tags(self, tags)

    @flow
    def stage(exp_id: str, parent: str):
        ctx = base.RunContext(experiment_id=exp_id, parent_run_id=parent)
        return base.run_cached(ctx, "sft", {"lr": 1.0}, {}, "data-fp", build)[0]

    exp_id = setup_mlflow()
    parent = MlflowClient().create_run(exp_id).info.run_id
    monkeypatch.setattr(StageRun, "set_tags", failing_set_tags)
    with pytest.raises(RuntimeError, match="store went away"):
        stage(exp_id, parent)
    client = MlflowClient()
    assert client.search_model_versions("name = 'rlhf-sft'") == []
    failed = mlflow.search_runs([exp_id], "tags.`rlhf.stage` = 'sft'", output_format="list")
    assert [r.info.status for r in failed] == ["FAILED"]

    monkeypatch.setattr(StageRun, "set_tags", real_set_tags)
    result = stage(exp_id, parent)
    assert result.status == "ran" and len(builds) == 2  # the failed attempt was not a cache hit
    assert len(client.search_model_versions("name = 'rlhf-sft'")) == 1
    assert stage(exp_id, parent).status == "cached" and len(builds) == 2
