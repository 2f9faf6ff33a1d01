"""Data stage: build (or later, load) and validate the pipeline's data, and version it in MLflow."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import read_pairs, read_prompts, read_ranked, read_sft
from rlhf_lib.demo_task import FILE_NAMES, build_demo_task, summarize
from stages.base import RunContext, as_state, log_dataset, run_cached
from stages.cache import StageResult
from stages.tracking import StageRun

READERS = {"sft": read_sft, "preferences": read_ranked, "prompts_train": read_prompts,
           "prompts_eval": read_prompts, "eval_pairs": read_pairs}
CONTEXT = {"sft": "training", "preferences": "training", "prompts_train": "training",
           "prompts_eval": "evaluation", "eval_pairs": "evaluation"}


def file_digest(data_dir: Path, key: str) -> str:
    """Content hash of one data file, from the data artifact's manifest."""
    return json.loads((data_dir / "manifest.json").read_text())[FILE_NAMES[key]]


def has_judge(data_dir: Path) -> bool:
    return json.loads((data_dir / "source.json").read_text()).get("judge") == "demo"


def _build(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path) -> None:
        paths = build_demo_task(cfg.data, out_dir)
        # Validate every file before any training starts: a bad row fails here, and nothing is cached.
        counts = {key: len(READERS[key](paths[key]).rows) for key in paths}
        stats = summarize(paths)
        (out_dir / "source.json").write_text(json.dumps({"source": "demo", "judge": "demo", "rows": counts}))
        run.log_metrics({**{f"data/rows_{k}": v for k, v in counts.items()},
                         **{f"data/{k}": v for k, v in stats.items()}}, step=0)
        for key, path in paths.items():
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            log_dataset(run, rows, source=f"{run.artifact_uri}/data/{path.name}", name=f"demo-{key}",
                        context=CONTEXT[key], digest=_sha(path))
    return build


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@flow(name="data", flow_run_name="data-{config.name}")
def data_stage(config: PipelineConfig, ctx: RunContext) -> StageResult:
    """Build the demo task deterministically from `data.seed` and log it as versioned data sets."""
    result, _ = run_cached(ctx, "data", config.data.model_dump(), {}, "demo", _build(config))
    return as_state(result)
