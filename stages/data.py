"""Data stage: build a built-in task (demo or arithmetic) or read the user's data, validate every row, and version
it in MLflow.

Every path writes the same five files (`FILE_NAMES`), so the stages downstream read one contract; the user's data
adds `conversations.jsonl`, the messages behind each rendered prompt (`rlhf_lib.data.conversations`). Every row is
validated here, before any training: a bad row fails the stage (FAILED run, nothing registered or cached) or, with
`data.on_bad_row=skip`, is dropped and counted by reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from rlhf_lib.arith_task import build_arithmetic_task
from rlhf_lib.arith_task import summarize as summarize_arithmetic
from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import (
    file_fingerprint,
    read_pairs,
    read_prompts,
    read_ranked,
    read_sft,
    write_jsonl,
)
from rlhf_lib.data.chat import Renderer
from rlhf_lib.data.conversations import FILE_NAME as CONVERSATIONS
from rlhf_lib.data.conversations import read_conversations, write_conversations
from rlhf_lib.data.sources import Source, hub_fingerprint
from rlhf_lib.data.user import build_user_task
from rlhf_lib.demo_task import FILE_NAMES, build_demo_task, summarize
from rlhf_lib.models import load_tokenizer
from stages.base import as_state, log_dataset, run_cached
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.manifest import dir_digest
from stages.models_io import local_model, model_source_digest
from stages.tracking import StageRun

READERS = {"sft": read_sft, "preferences": read_ranked, "prompts_train": read_prompts,
           "prompts_eval": read_prompts, "eval_pairs": read_pairs, "prompts_val": read_prompts,
           "adversarial_pairs": read_pairs}
CONTEXT = {"sft": "training", "preferences": "training", "prompts_train": "training",
           "prompts_eval": "evaluation", "eval_pairs": "evaluation", "prompts_val": "validation",
           "adversarial_pairs": "evaluation"}
USER_SOURCES = ("preferences", "eval_preferences", "sft", "prompts", "eval_prompts")


def file_digest(data_dir: Path, key: str) -> str:
    """Content hash of one data file, from the data artifact's manifest."""
    return json.loads((data_dir / "manifest.json").read_text())[FILE_NAMES[key]]


def optional_digest(data_dir: Path, key: str) -> str:
    """Content hash of a file only some tasks write (the demo task's `prompts_val`, `adversarial_pairs`); "" when
    the data has none."""
    return json.loads((data_dir / "manifest.json").read_text()).get(FILE_NAMES[key], "")


def conversations_digest(data_dir: Path) -> str:
    """Content hash of `conversations.jsonl` ("" where the data has none: the built-in tasks, older data)."""
    return json.loads((data_dir / "manifest.json").read_text()).get(CONVERSATIONS, "")


def conversations(data_dir: Path, reward_own_model: bool) -> dict:
    """The messages of each rendered prompt, where the RM has a base model of its own (`reward.name_or_path`, whose
    tokenizer may render differently); {} otherwise."""
    return read_conversations(data_dir / CONVERSATIONS) if reward_own_model else {}


def source_info(data_dir: Path) -> dict:
    """What the data stage recorded about its data: `source` ("demo", "arithmetic" or "user"), `judge`, row counts,
    formats."""
    return json.loads((data_dir / "source.json").read_text())


def has_judge(data_dir: Path) -> bool:
    return source_info(data_dir).get("judge") == "demo"


def dataset_name(data_dir: Path, key: str) -> str:
    """The MLflow data set name of one file: `demo-<key>`, `arithmetic-<key>`, or `<user source name>-<key>`."""
    return f"{source_info(data_dir).get('name', 'demo')}-{key}"


def _validate_and_log(run: StageRun, paths: dict[str, Path], name: str) -> dict[str, int]:
    """Read every written file back through the contract's readers (a bad row fails here, before any training),
    and log each as an MLflow data set. Returns the row counts."""
    counts = {key: len(READERS[key](paths[key]).rows) for key in paths}
    for key, path in paths.items():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        log_dataset(run, rows, source=f"{run.artifact_uri}/data/{path.name}", name=f"{name}-{key}",
                    context=CONTEXT[key], digest=file_fingerprint(path))
    return counts


def _build_demo(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path) -> None:
        paths = build_demo_task(cfg.data, out_dir)
        counts = _validate_and_log(run, paths, "demo")
        stats = summarize(paths)
        (out_dir / "source.json").write_text(json.dumps({"source": "demo", "judge": "demo", "rows": counts}))
        run.log_metrics({**{f"data/rows_{k}": v for k, v in counts.items()},
                         **{f"data/{k}": v for k, v in stats.items()}}, step=0)
    return build


def _template_tokenizer(cfg: PipelineConfig):
    """The loader of the policy's tokenizer, whose chat template renders the rows (None: a model built here)."""
    m = cfg.model

    def load():
        if not m.name_or_path:
            return None
        return load_tokenizer(local_model(m.name_or_path, m.revision), m.revision, m.trust_remote_code)
    return load


def _build_arithmetic(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path) -> None:
        renderer = Renderer(_template_tokenizer(cfg), cfg.data.render)  # a pretrained policy's chat template
        paths = build_arithmetic_task(cfg.data, out_dir, renderer)
        if renderer.templated():
            write_conversations(out_dir / CONVERSATIONS, renderer.conversations)
        run.set_tags({"rlhf.data.rendering": "chat_template" if renderer.templated() else "text"})
        counts = _validate_and_log(run, paths, "arithmetic")
        # No gold judge: the answer column is the ground truth, read by the exact-match reward. The statistics go
        # to source.json rather than metrics: they only confirm what the config asked for.
        (out_dir / "source.json").write_text(json.dumps({
            "source": "arithmetic", "judge": None, "name": "arithmetic", "rows": counts,
            "reward": "rlhf_lib.rewards.builtin:exact_match", "stats": summarize_arithmetic(paths)}, indent=1))
        run.log_metrics({f"data/rows_{k}": v for k, v in counts.items()}, step=0)
    return build


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _build_user(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path) -> None:
        # Conversational rows are rendered with the policy's chat template, when it has one.
        renderer = Renderer(_template_tokenizer(cfg), cfg.data.render)
        task = build_user_task(cfg.data, renderer)
        paths = {key: write_jsonl(out_dir / FILE_NAMES[key], rows) for key, rows in task.records.items()}
        # The conversation of each rendered prompt, for a reward model that renders with its own template.
        write_conversations(out_dir / CONVERSATIONS, renderer.conversations)
        name = Source(cfg.data.preferences).name
        counts = _validate_and_log(run, paths, name)
        sources = {key: asdict(report) for key, report in task.sources.items()}
        (out_dir / "source.json").write_text(json.dumps({
            "source": "user", "judge": None, "name": name, "rows": counts, "sources": sources,
            "dropped_heldout": task.dropped, "rendering": task.rendering}, indent=1, ensure_ascii=False))
        metrics = {f"data/rows_{k}": v for k, v in counts.items()}
        metrics |= {f"data/dropped_heldout_{k}": v for k, v in task.dropped.items()}
        for key, report in task.sources.items():
            metrics[f"data/skipped_{key}"] = sum(report.skipped.values())
            metrics |= {f"data/skipped_{key}/{_slug(reason)}": n for reason, n in report.skipped.items()}
            if report.skipped:
                get_run_logger().warning("data: skipped %d bad rows of %s: %s", sum(report.skipped.values()),
                                         report.source, report.skipped)
        run.log_metrics(metrics, step=0)
        run.set_tags({f"rlhf.data.{k}_format": r.format for k, r in task.sources.items()}
                     | {"rlhf.data.rendering": task.rendering or "text"})
    return build


def user_fingerprint(cfg: PipelineConfig) -> str:
    """The content identity of the user's data: the bytes of each local file or directory, `datasets`' fingerprint
    of a hub data set, and the policy's model (its chat template renders conversational rows)."""
    d = cfg.data
    parts = {}
    for key in USER_SOURCES:
        if spec := getattr(d, key):
            split = d.eval_split if key.startswith("eval_") else d.split
            src = Source(spec, split, d.hub_data_dir, d.hub_revision)
            kind = src.kind
            parts[key] = (file_fingerprint(src.path) if kind in ("jsonl", "file")
                          else dir_digest(src.path) if kind == "dir" else "hub:" + hub_fingerprint(src))
    parts["model"] = model_source_digest(cfg.model.name_or_path, cfg.model.revision)
    return "user:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@flow(name="data", flow_run_name="data-{config.name}")
def data_stage(config: PipelineConfig, ctx: RunContext) -> StageResult:
    """Build the built-in task (`data.task`: demo or arithmetic) deterministically from `data.seed`, or read and
    validate the user's data (`data.*` sources), and log the five files as versioned data sets."""
    ctx = on_node(ctx, config.resources)  # on machine_rank > 0: node 0's data, once it is in MLflow
    m = config.model
    if config.data.task == "arithmetic":  # the config refuses arithmetic with user data
        section, fingerprint = {"data": config.data.key()}, "arithmetic"
        if m.name_or_path and config.data.render != "text":  # rendered by the pretrained policy's chat template
            section["model"] = {"name_or_path": m.name_or_path, "revision": m.revision,
                                "trust_remote_code": m.trust_remote_code}
            fingerprint += ":" + model_source_digest(m.name_or_path, m.revision)
        result, _ = run_cached(ctx, "data", section, {}, fingerprint, _build_arithmetic(config))
        return as_state(result)
    if not config.data.user_data:
        result, _ = run_cached(ctx, "data", {"data": config.data.key()}, {}, "demo", _build_demo(config))
        return as_state(result)
    section = {"data": config.data.key(),
               "model": {"name_or_path": m.name_or_path, "revision": m.revision, "trust_remote_code": m.trust_remote_code}}
    result, _ = run_cached(ctx, "data", section, {}, user_fingerprint(config), _build_user(config))
    return as_state(result)


def prompt_columns(data_dir: Path, *keys: str) -> dict[str, dict[str, Any]]:
    """The extra fields of the prompts of the files `keys` (e.g. the arithmetic task's `answer`), by prompt text."""
    return {p.prompt: p.columns for key in keys for p in read_prompts(data_dir / FILE_NAMES[key]).rows if p.columns}
