"""Data stage: build the config's task (`rlhf_lib.tasks`: demo, arithmetic, or the user's data), validate every row,
and version it in MLflow.

Every task writes the same five files (`rlhf_lib.data.contract`), so the stages downstream read one contract; the user's data
adds `conversations.jsonl`, the messages behind each rendered prompt (`rlhf_lib.data.conversations`). Every row is
validated here, before any training: a bad row fails the stage (FAILED run, nothing registered or cached) or, with
`data.on_bad_row=skip`, is dropped and counted by reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from rlhf_lib.config import PipelineConfig
from rlhf_lib.data import file_fingerprint, read_pairs, read_prompts, read_ranked, read_sft
from rlhf_lib.data.chat import Renderer
from rlhf_lib.data.contract import FILE_NAMES
from rlhf_lib.data.conversations import FILE_NAME as CONVERSATIONS
from rlhf_lib.data.conversations import read_conversations, write_conversations
from rlhf_lib.models import load_tokenizer
from rlhf_lib.tasks import Digests, Task, task_for_config, task_of_data
from stages.base import as_state, log_dataset
from stages.cache import StageResult
from stages.context import RunContext, on_node
from stages.inputs import StageInputs, frozen, run_stage
from stages.manifest import dir_digest
from stages.models_io import local_model, model_source_digest
from stages.tracking import StageRun

READERS = {"sft": read_sft, "preferences": read_ranked, "prompts_train": read_prompts,
           "prompts_eval": read_prompts, "eval_pairs": read_pairs, "prompts_val": read_prompts,
           "adversarial_pairs": read_pairs}
CONTEXT = {"sft": "training", "preferences": "training", "prompts_train": "training",
           "prompts_eval": "evaluation", "eval_pairs": "evaluation", "prompts_val": "validation",
           "adversarial_pairs": "evaluation"}


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


def data_task(data_dir: Path) -> Task:
    """The task that built the data (`rlhf_lib.tasks.task_of_data`): its gold judge, eval groups and report
    sections."""
    return task_of_data(data_dir)


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


@dataclass(frozen=True)
class DataInputs(StageInputs):
    """The data stage's resolved inputs: its task (`rlhf_lib.tasks`) and the local folder of the policy's model
    (`model.name_or_path`; None: a model built here), whose chat template renders conversational rows."""

    task: Task | None = None
    template_model: str | None = None


def resolve_data(config: PipelineConfig) -> DataInputs:
    """The data stage's one resolution step: the task, its key (`data_identity`), the policy model's folder where its
    chat template may render the rows."""
    m = config.model
    section, fingerprint = data_identity(config)
    renders = m.name_or_path and config.data.render != "text"
    return DataInputs(frozen(section), frozen({}), fingerprint, task=task_for_config(config.data),
                      template_model=local_model(m.name_or_path, m.revision) if renders else None)


def _build(cfg: PipelineConfig):
    def build(run: StageRun, out_dir: Path, inputs: DataInputs, dirs: Mapping[str, Path]) -> None:
        m = cfg.model

        def template():  # loaded at the first row that needs it
            return (load_tokenizer(inputs.template_model, m.revision, m.trust_remote_code)
                    if inputs.template_model else None)
        # Conversational rows (user data, the arithmetic task on a pretrained policy) are rendered with the policy's
        # chat template, when it has one.
        built = inputs.task.build(cfg, out_dir, Renderer(template, cfg.data.render))
        if built.conversations is not None:  # the messages of each rendered prompt, for an RM with its own template
            write_conversations(out_dir / CONVERSATIONS, built.conversations)
        counts = _validate_and_log(run, dict(built.paths), built.name)
        (out_dir / "source.json").write_text(json.dumps({**built.source, "rows": counts}, indent=1,
                                                        ensure_ascii=False))
        for line in built.warnings:
            get_run_logger().warning("%s", line)
        run.log_metrics({f"data/rows_{k}": v for k, v in counts.items()} | dict(built.metrics), step=0)
        if built.tags:
            run.set_tags(dict(built.tags))
    return build


def data_identity(cfg: PipelineConfig) -> tuple[dict[str, Any], str]:
    """The data stage's key section and data fingerprint: its task's `identity` (for user data, the content of every
    source and of the policy's model, whose chat template renders conversational rows)."""
    return task_for_config(cfg.data).identity(cfg, Digests(model_source_digest, dir_digest))


@flow(name="data", flow_run_name="data-{config.name}")
def data_stage(config: PipelineConfig, ctx: RunContext) -> StageResult:
    """Build the config's task (`rlhf_lib.tasks`: the demo or arithmetic task from `data.seed`, or the user's data
    sources read and validated) and log the contract's files as versioned data sets."""
    ctx = on_node(ctx, config.resources)  # on machine_rank > 0: node 0's data, once it is in MLflow
    result, _ = run_stage(ctx, "data", resolve_data(config), _build(config))
    return as_state(result)


def prompt_columns(data_dir: Path, *keys: str) -> dict[str, dict[str, Any]]:
    """The extra fields of the prompts of the files `keys` (e.g. the arithmetic task's `answer`), by prompt text."""
    return {p.prompt: p.columns for key in keys for p in read_prompts(data_dir / FILE_NAMES[key]).rows if p.columns}
