"""The `rlhf` flow: data -> sft -> reward -> ppo -> eval, each a cached sub-flow, and the branch data -> sft -> dpo
beside the reward model and PPO (`dpo.enabled`, or the `dpo` pipeline). It reads like a table of contents; the
stages do the work."""

from __future__ import annotations

import hashlib
import time
from typing import Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import deployment, flow_run

from flows.code_policy import check_deployment_config
from flows.path_policy import check_deployment_paths
from flows.placement import Dispatched, run_on_pool
from rlhf_lib.config import PipelineConfig, build_config
from rlhf_lib.devices import resolve_device
from rlhf_lib.intervals import split_intervals, with_interval
from rlhf_lib.process import configure_process
from stages.artifact_cache import clean_staging
from stages.cache import StageResult, given_model
from stages.context import RunContext
from stages.data import data_stage
from stages.dpo import dpo_stage
from stages.eval import eval_stage
from stages.owner import owner_tags
from stages.ppo import ppo_control_stage, ppo_stage
from stages.reaper import reap
from stages.reward import reward_stage
from stages.sft import sft_stage
from stages.tracking import RetryingClient, setup_mlflow, tracking_uri

Pipeline = Literal["full", "sft", "reward", "ppo", "eval", "dpo"]
STAGES = ("data", "sft", "reward", "ppo", "eval")
# Branches off the chain: stage -> the last stage of the chain it reads (DPO trains the SFT model on the data's pairs).
BRANCHES = {"dpo": "sft"}
LAST_STAGE = {"full": "eval", "eval": "eval", "ppo": "ppo", "reward": "reward", "sft": "sft", "dpo": "sft"}


def downstream_of(stages: list[str]) -> list[str]:
    """The named stages and every stage after them: a recomputed stage invalidates what it feeds (a branch such as
    dpo is after the chain's stages up to the one it reads)."""
    known = [*STAGES, *BRANCHES]
    bad = sorted(set(stages) - set(known))
    if bad:
        raise ValueError(f"force: unknown stage(s) {bad}; expected some of {known}")
    first = min((STAGES.index(s) for s in stages if s in STAGES), default=len(STAGES))
    chain = list(STAGES[first:])
    return chain + [b for b, parent in BRANCHES.items() if b in stages or parent in chain]


def reward_model_uri(config: PipelineConfig, reward_model: str | None) -> str | None:
    """The reward model PPO scores with instead of the reward stage's: the `reward_model` parameter or the URI of
    the `ppo.rewards` source of kind model (the two must agree). A parameter without such a source is an error."""
    source = config.ppo.reward_model
    if reward_model and source is None:
        raise ValueError(f"reward_model {reward_model!r} was given but ppo.rewards has no source of kind model")
    named = source.model if source else None
    if reward_model and named and reward_model != named:
        raise ValueError(f"reward_model {reward_model!r} differs from ppo.rewards[{source.name!r}].model {named!r}")
    return reward_model or named


def merged_config(preset: str, config: PipelineConfig) -> PipelineConfig:
    """The keys `config` was given (pydantic's `model_fields_set`, section by section) merged onto `preset`, and
    validated again as a whole (an unknown key or a wrong type names the key)."""
    from flows.settings import preset_layer

    return build_config([preset_layer(preset), ("the config parameter", config.model_dump(exclude_unset=True))])


def record_parameters(updates: dict) -> None:
    """Replace parameters of this flow run on the Prefect server, so that the run shows what ran."""
    from prefect.client.orchestration import get_client

    if flow_run.id is None:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, parameters={**flow_run.parameters, **updates})


def deployment_parameters(pipeline: str, preset: str, config: PipelineConfig) -> dict:
    """A deployment's default parameters: the preset's whole config (the Prefect UI's form shows its values), and
    the preset's name, onto which a partial `config` parameter is merged (`merged_config`)."""
    return {"pipeline": pipeline, "preset": preset, "config": config.model_dump(mode="json")}


def config_hash(config: PipelineConfig) -> str:
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:8]


def run_name() -> str:
    """`<pipeline>-<config name>-<config hash>`, e.g. `full-demo-1a2b3c4d`."""
    params = flow_run.parameters
    cfg = params.get("config")
    cfg = cfg if isinstance(cfg, PipelineConfig) else PipelineConfig.model_validate(cfg or {})
    if params.get("preset"):
        try:
            cfg = merged_config(params["preset"], cfg)
        except ValueError:  # the flow itself reports the bad key
            pass
    return f"{params.get('pipeline', 'full')}-{cfg.name}-{config_hash(cfg)}"


@flow(name="rlhf", flow_run_name=run_name, validate_parameters=True)
def rlhf(
    config: PipelineConfig = PipelineConfig(),
    pipeline: Pipeline = "full",
    force: list[str] | None = None,
    sft_model: str | None = None,
    reward_model: str | None = None,
    preset: str | None = None,
    local_only: bool = False,
) -> dict:
    """Run the RLHF pipeline up to `pipeline`'s last stage; unchanged stages come from the cache.

    `force` names stages to recompute even on a cache hit, together with every stage after them.
    The `dpo` pipeline runs data -> sft -> dpo; `full` (and `eval`) run dpo too when `dpo.enabled`, before the eval,
    which samples the DPO policy beside PPO's.
    `sft_model` / `reward_model` take a model URI (`models:/rlhf-reward/3`, `models:/rlhf-reward@champion`,
    `runs:/<run id>/model`) to use instead of that stage: PPO sweeps against one chosen reward model.
    `preset` (the deployments set it): the keys `config` was given are merged onto that preset, so a partial config
    such as `{"ppo": {"lr": 1e-4}}` changes one key of the preset; without it `config` is used as it is.
    A stage named in `resources.work_pools` runs on that pool through its deployment (`flows.placement`);
    `local_only` (set on those runs) runs every stage here.
    """
    if preset is not None:
        from flows.settings import host_advice, tiny_defaults

        config = merged_config(preset, config)
        record_parameters({"config": config.model_dump(mode="json")})
        for message in tiny_defaults(config) + host_advice(config):  # not through the CLI's advice
            get_run_logger().warning(message)
    if deployment.id is not None:  # parameters from the Prefect API: data and numbers, code only where the host allows
        from stages.home import state_dir

        check_deployment_config(config, state_dir())
        check_deployment_paths(config, state_dir(), sft_model, reward_model)
    resolve_device(config.resources.device)  # refused before any run is opened or stage runs
    force = downstream_of(force or [])
    configure_process(config.torch_threads)
    t0 = time.perf_counter()
    experiment_id = setup_mlflow()
    reap(experiment_id)  # runs of a killed process on this machine: FAILED, their model versions deleted
    clean_staging()  # and their half-written outputs
    # A follower node (resources.machine_rank > 0) trains with node 0 and logs nothing: node 0's runs are the record.
    follower = config.resources.machine_rank > 0
    client = NoParentRun() if follower else RetryingClient()
    name = flow_run.name or f"{pipeline}-{config.name}"
    parent_id = "" if follower else client.create_run(experiment_id, run_name=name, tags={
        "rlhf.pipeline": pipeline, "rlhf.config_hash": config_hash(config),
        "rlhf.prefect_flow_run_id": str(flow_run.id or ""), **owner_tags(),
    }).info.run_id
    client.log_dict(parent_id, config.model_dump(mode="json"), "config.json")  # redacted (rlhf_lib.redaction)
    ctx = RunContext(experiment_id=experiment_id, parent_run_id=parent_id, force=force)
    last = STAGES.index(LAST_STAGE[pipeline])
    results: dict[str, StageResult] = {}
    eval_metrics: dict | None = None
    placed: dict[str, Dispatched] = {}
    controls: dict[str, StageResult] = {}

    def on_pool(stage: str) -> StageResult | None:
        """The stage's result from its work pool, or None when it runs here."""
        pool = None if local_only else config.resources.work_pools.get(stage)
        if pool is None:
            return None
        pinned = {k: r.source or r.model_uri for k, r in results.items() if k in ("sft", "reward")}
        placed[stage] = run_on_pool(stage, pool, config, force=stage in force, timeout_s=config.resources.pool_timeout_s,
                                    sft_model=pinned.get("sft", sft_model), reward_model=pinned.get("reward", reward_uri))
        for key, value in {"work_pool": pool, "flow_run": placed[stage].flow_run_id,
                           "cache_hit": str(placed[stage].result.status == "cached").lower()}.items():
            client.set_tag(parent_id, f"rlhf.{key}.{stage}", value)
        return placed[stage].result

    try:
        # Models the user named are resolved first: a missing version fails before any work.
        reward_uri = reward_model_uri(config, reward_model) if last >= 3 else reward_model
        given = {stage: given_model(stage, uri) for stage, uri in (("sft", sft_model), ("reward", reward_uri))
                 if uri and last >= STAGES.index(stage)}
        # PPO needs the reward stage only when a reward source is a model (ppo.rewards): functions and endpoints
        # alone skip it (data -> sft -> ppo -> eval).
        needs_rm = last == 2 or config.ppo.reward_model is not None
        results["data"] = data_stage(config, ctx)
        if last >= 1:
            results["sft"] = given.get("sft") or on_pool("sft") or sft_stage(config, ctx, results["data"])
        if last >= 2 and needs_rm:
            results["reward"] = (given.get("reward") or on_pool("reward")
                                 or reward_stage(config, ctx, results["data"], results["sft"]))
        reward = results.get("reward")
        if last >= 3:
            results["ppo"] = on_pool("ppo") or ppo_stage(config, ctx, results["data"], results["sft"], reward)
        if last >= 4:  # the control arms (eval.controls): PPO's cached siblings, the reward replaced
            for name in config.eval.controls:
                controls[name] = ppo_control_stage(config, ctx, results["data"], results["sft"], reward, control=name)
        if pipeline == "dpo" or (last >= 4 and config.dpo.enabled):  # the branch beside RM -> PPO, before the
            # eval, which samples its policy beside PPO's
            results["dpo"] = on_pool("dpo") or dpo_stage(config, ctx, results["data"], results["sft"])
        if last >= 4 and not follower:  # the evaluation is node 0's
            if result := on_pool("eval"):
                results["eval"], eval_metrics = result, placed["eval"].metrics
            else:
                results["eval"], eval_metrics = eval_stage(config, ctx, results["data"], results["sft"], reward,
                                                           results["ppo"], controls, results.get("dpo"))
    except BaseException:
        client.set_terminated(parent_id, "FAILED")
        raise
    if last == 2 and "reward" in results and results["reward"].source is None and not follower:
        # `rlhf run reward`: the held-out accuracy of the RM it trained is the pipeline's figure
        eval_metrics = reward_figures(client.get_run(results["reward"].mlflow_run_id).data.metrics)
    if "dpo" in results and not follower:  # the held-out accuracy of its implicit reward, beside the RM's
        eval_metrics = (eval_metrics or {}) | dpo_figures(client.get_run(results["dpo"].mlflow_run_id).data.metrics)
    all_cached = all(r.status == "cached" for r in [*results.values(), *controls.values()])
    skipped = ({"reward": {"status": "skipped", "seconds": 0.0, "mlflow_run_id": "",
                           "reason": "no reward source of kind model in ppo.rewards"}}
               if last >= 3 and "reward" not in results else {})
    client.set_tag(parent_id, "rlhf.cache_hit", str(all_cached).lower())
    summary = {
        "pipeline": pipeline, "status": "completed", "mlflow_tracking_uri": tracking_uri(),
        "mlflow_experiment_id": experiment_id, "mlflow_run_id": parent_id, "prefect_flow_run_id": str(flow_run.id or ""),
        "stages": {k: stage_summary(results[k], placed.get(k)) if k in results else skipped[k]
                   for k in (*STAGES, *BRANCHES) if k in results or k in skipped}
        | {f"ppo-{name}": stage_summary(result, None) for name, result in controls.items()},
        "eval": eval_metrics, "seconds": round(time.perf_counter() - t0, 2),
    }
    client.log_dict(parent_id, summary, "summary.json")  # what a flow run that sent a stage here reads back
    client.set_terminated(parent_id, "FINISHED")
    _markdown(summary)
    return summary


def reward_figures(metrics: dict[str, float]) -> dict:
    """The held-out figures of a pipeline that ends at the reward stage, from the reward run's MLflow metrics: the
    RM's pairwise accuracy on the held-out pairs with its 95 % interval, as the eval stage reports it (none when the
    run has no such figure)."""
    acc = metrics.get("reward/heldout_accuracy")
    if acc is None:
        return {}
    return {"reward_model_accuracy": acc, "reward_model_accuracy_ci95": [
        metrics["reward/heldout_accuracy_ci95_low"], metrics["reward/heldout_accuracy_ci95_high"]]}


def dpo_figures(metrics: dict[str, float]) -> dict:
    """The held-out figures of the `dpo` pipeline, from the DPO run's MLflow metrics: the share of the held-out pairs
    (the reward model's) that the implicit reward β·(log π − log π_ref) orders right, with its 95 % interval."""
    acc = metrics.get("dpo/heldout_accuracy")
    if acc is None:
        return {}
    return {"dpo_accuracy": acc, "dpo_accuracy_ci95": [metrics["dpo/heldout_accuracy_ci95_low"],
                                                       metrics["dpo/heldout_accuracy_ci95_high"]]}


class NoParentRun:
    """The parent-run calls of a follower node: none (it creates no MLflow run; node 0's parent run is the record)."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def stage_summary(result: StageResult, placed: Dispatched | None) -> dict:
    """A stage's entry of the summary; a stage that ran on a work pool also names the pool and its flow run."""
    out = result.summary()
    return out | ({"work_pool": placed.pool, "flow_run_id": placed.flow_run_id} if placed else {})


def _markdown(summary: dict) -> None:
    lines = [f"# RLHF pipeline `{summary['pipeline']}`", "",
             f"MLflow parent run `{summary['mlflow_run_id']}` in `{summary['mlflow_tracking_uri']}`", "",
             "| stage | status | MLflow run | model |", "| --- | --- | --- | --- |"]
    for stage, s in summary["stages"].items():
        lines.append(f"| {stage} | {s['status']} | `{s.get('mlflow_run_id', '')}` | {s.get('model_uri', '')} |")
    if "eval" in summary["stages"]:
        report = f"{summary['stages']['eval']['mlflow_run_id']}/artifacts/report/report.html"
        lines += ["", f"Eval report: `report/report.html` of MLflow run `{summary['stages']['eval']['mlflow_run_id']}` "
                  f"(MLflow UI: experiment `rlhf` → that run → Artifacts; on the local store: "
                  f"`mlartifacts/{report}`)"]
    if summary.get("eval"):
        lines += ["", "| eval metric | value |", "| --- | --- |"]
        values, bounds = split_intervals(summary["eval"])
        lines += [f"| {k} | {with_interval(v, bounds.get(k))} |" for k, v in values.items()]
    create_markdown_artifact("\n".join(lines), key="rlhf-summary",
                             description="Where this pipeline run's artifacts are")
