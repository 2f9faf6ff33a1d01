"""One resolution step per stage (`stages.inputs`, issue 56): what a stage needs from outside its config is resolved
before its build into a frozen value, and a build that calls a resolver fails (`ResolverInBuild`)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from stages import inputs as stage_inputs
from stages.cache import StageResult
from stages.resolving import RESOLVERS, ResolverInBuild, building, resolver

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("data", "sft", "reward", "ppo", "dpo", "eval")


def test_the_resolvers_are_marked():
    from stages.eval_judge import eval_judge_model  # registered at import

    assert eval_judge_model.__wrapped__  # the guarded function keeps the plain one
    assert {"stages.artifact_cache.download", "stages.models_io.local_model", "stages.models_io.model_source_digest",
            "stages.models_io.judge_models", "stages.eval_judge.eval_judge_model",
            "stages.inputs.memory_check"} <= set(RESOLVERS)


def test_a_resolver_runs_outside_a_build_and_refuses_inside_one():
    @resolver
    def find(name: str) -> str:
        return f"/models/{name}"

    assert find("x") == "/models/x"
    with building("ppo"), pytest.raises(ResolverInBuild, match="the ppo stage's build called the resolver"):
        find("x")
    assert find("x") == "/models/x"  # the span ended
    RESOLVERS.remove(f"{__name__}.{find.__qualname__}")


def test_run_stage_fetches_the_models_then_builds_with_resolvers_refused(monkeypatch, tmp_path):
    sft = StageResult(stage="sft", status="ran", cache_key="k", mlflow_run_id="run-1", artifact_uri="runs:/run-1/model",
                      digest="abc")
    inputs = stage_inputs.StageInputs(stage_inputs.frozen({"lr": 1}), stage_inputs.frozen({"sft": sft}), "fp",
                                      stage_inputs.frozen({"sft": sft}))
    fetched, seen = [], {}
    monkeypatch.setattr(stage_inputs, "download", lambda uri, digest: fetched.append((uri, digest)) or tmp_path)

    def run_cached(ctx, stage, section, upstream, fingerprint, build, fetch=False, variant=None):
        seen.update(stage=stage, section=section, upstream=upstream, fingerprint=fingerprint)
        build("run", tmp_path / "out")
        return "result", None

    monkeypatch.setattr(stage_inputs, "run_cached", run_cached)

    def build(run, out_dir, got, dirs):
        assert got is inputs and dict(dirs) == {"sft": tmp_path}
        from stages.artifact_cache import download  # the real resolver: refused in here
        with pytest.raises(ResolverInBuild):
            download("runs:/run-1/model")

    assert stage_inputs.run_stage(None, "sft", inputs, build) == ("result", None)
    assert fetched == [("runs:/run-1/model", "abc")]  # after the look-up, on the miss
    assert seen == {"stage": "sft", "section": {"lr": 1}, "upstream": {"sft": sft}, "fingerprint": "fp"}


def test_the_inputs_are_frozen():
    inputs = stage_inputs.StageInputs(stage_inputs.frozen({"a": 1}), stage_inputs.frozen({}), "fp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.fingerprint = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        inputs.section["a"] = 2  # type: ignore[index]


def _calls(tree: ast.AST) -> set[str]:
    return {n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}


def test_every_stage_resolves_once_and_its_build_calls_no_resolver():
    """Each stage's flow resolves its inputs (`resolve_<stage>`) and runs through `run_stage`; its build reads the
    inputs: no call of a resolver by name in the build's source, and no stage calls `run_cached` or `preflight`
    itself. (At run time `building` refuses them too: every end-to-end test runs the builds.)"""
    names = {r.rsplit(".", 1)[1] for r in RESOLVERS} | {"preflight", "run_cached", "data_task",
                                                         "environment_digest", "rm_edge", "reward_base"}
    for stage in STAGES:
        tree = ast.parse((ROOT / "stages" / f"{stage}.py").read_text())
        funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        assert f"resolve_{stage}" in funcs or stage == "eval", stage
        assert "run_stage" in _calls(tree) and not {"run_cached", "preflight"} & _calls(tree), stage
        builds = [f for f in ast.walk(funcs["_build"]) if isinstance(f, ast.FunctionDef) and f.name == "build"]
        assert builds, stage
        assert not names & _calls(builds[0]), (stage, names & _calls(builds[0]))


@pytest.mark.parametrize("own_base, baselines, keyed", [(False, True, True), (False, False, True), (True, True, True),
                                                         (True, False, False)])
def test_the_reward_key_holds_the_sft_model_whenever_the_stage_reads_it(monkeypatch, tmp_path, own_base, baselines,
                                                                        keyed):
    """An RM from its own base model (reward.name_or_path) does not start from the SFT model, but with reward.baselines
    its log-likelihood baseline (and the rm_no_edge alarm) reads it: the SFT model's digest is in the key then too,
    while the lineage (upstream) still says the RM was not trained from it."""
    from rlhf_lib.config import PipelineConfig
    from stages import reward as reward_stage
    from stages.cache import StageResult

    monkeypatch.setattr(reward_stage, "download", lambda uri, digest: tmp_path)
    for name in ("file_digest", "optional_digest", "conversations_digest"):
        monkeypatch.setattr(reward_stage, name, lambda *a, **k: "d")
    monkeypatch.setattr(reward_stage, "model_source_digest", lambda *a, **k: "m")
    monkeypatch.setattr(reward_stage, "reward_base", lambda cfg: None)
    monkeypatch.setattr(reward_stage, "memory_check", lambda cfg, stage: None)
    cfg = PipelineConfig.model_validate({"reward": {"baselines": baselines,
                                                    **({"name_or_path": "/models/rm"} if own_base else {})}})
    result = dict(status="ran", cache_key="k", mlflow_run_id="r", artifact_uri="a", digest="d1")
    data, sft = StageResult(stage="data", **result), StageResult(stage="sft", **result)
    inputs = reward_stage.resolve_reward(cfg, data, sft)
    other = reward_stage.resolve_reward(cfg, data, sft.model_copy(update={"digest": "d2"}))
    assert (inputs.fingerprint != other.fingerprint or dict(inputs.upstream) != dict(other.upstream)) is keyed
    assert "sft" in inputs.models  # read in any case
    assert ("sft" in inputs.upstream) is not own_base  # the lineage tags: trained from the SFT model or not
