"""`rlhf reference`: the config and metric reference (docs/reference.md), generated from the code: every config key
from the pydantic fields with its type, its default in each preset and its description; the benchmarks' own keys;
every metric from `rlhf_lib.metric_docs`; the PPO alarms. A test fails when the file and the code disagree."""

from __future__ import annotations

import json
import types
import typing
import warnings
from typing import Any, Literal

from pydantic import BaseModel

from rlhf_lib.config import PipelineConfig
from rlhf_lib.metric_docs import RUNS
from rlhf_lib.ppo.alarms import RULES

PRESETS = ("demo", "micro", "arithmetic", "arithmetic-tool", "gpt2-124m", "pythia-160m", "qwen-0.5b")
RUN_TITLES = {"ppo": "PPO run (`ppo-<key>`), one value per iteration", "sft": "SFT run, one value per step",
              "reward": "Reward run, one value per step", "data": "Data run", "eval": "Eval run",
              "dpo": "DPO run, one value per step (TRL's names)"}


def _type(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        return _type(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if typing.get_origin(annotation) in (list, dict):
        return typing.get_origin(annotation).__name__
    return getattr(annotation, "__name__", str(annotation))


def _value(v: Any) -> str:
    return f"`{json.dumps(v)}`"


def _rows(model: type[BaseModel], values: list[dict[str, Any]], prefix: str = "") -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, [v[name] for v in values], f"{prefix}{name}.")
            continue
        item = typing.get_args(ann)[0] if typing.get_origin(ann) is list else None
        if isinstance(item, type) and issubclass(item, BaseModel):  # ppo.rewards: a list of sources
            rows += _list_rows(f"{prefix}{name}", field, item, [v[name] for v in values])
            continue
        cells = [_value(v[name]) for v in values]
        if len(set(cells)) == 1:  # the same in every preset: one cell
            cells = [cells[0]] + ["〃"] * (len(cells) - 1)
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_type(ann)} | " + " | ".join(cells) + f" | {desc} |")
    return rows


def _list_rows(key: str, field: Any, item: type[BaseModel], values: list[list[dict[str, Any]]]) -> list[str]:
    """A list of sub-configs (`ppo.rewards`): one row with each preset's entries as `name:kind`, then a row per
    field of an entry with its default (`required` where it has none)."""
    cells = [_value([f"{x['name']}:{x['kind']}" for x in v]) for v in values]
    if len(set(cells)) == 1:
        cells = [cells[0]] + ["〃"] * (len(cells) - 1)
    desc = (field.description or "").replace("|", "\\|")
    rows = [f"| `{key}` | list | " + " | ".join(cells) + f" | {desc} |"]
    for name, sub in item.model_fields.items():
        default = "required" if sub.is_required() else _value(sub.get_default(call_default_factory=True))
        cells = [default] + ["〃"] * (len(values) - 1)
        desc = (sub.description or "").replace("|", "\\|")
        rows.append(f"| `{key}[].{name}` | {_type(sub.annotation)} | " + " | ".join(cells) + f" | {desc} |")
    return rows


def config_section() -> list[str]:
    from flows.settings import HostPrecisionWarning, load_config

    with warnings.catch_warnings():  # the presets are read, not run: this host's bf16 does not matter
        warnings.simplefilter("ignore", HostPrecisionWarning)
        values = [load_config(p).model_dump(mode="json") for p in PRESETS]
    head = "| key | type | " + " | ".join(PRESETS) + " | meaning |"
    out = ["## Config keys", "",
           "Every key of `PipelineConfig`, with its value in each preset (`〃`: the same as in `demo`). Set them in "
           "a YAML file (`--config`), with `--set key=value`, or in the Prefect UI's form of a deployment.", "",
           head, "| " + " | ".join(["---"] * (len(PRESETS) + 3)) + " |"]
    return out + _rows(PipelineConfig, values)


def bench_section() -> list[str]:
    from benchmarks.config import BenchConfig

    out = ["## Benchmark keys", "", "`rlhf bench` reads the pipeline's keys above plus these (`--set bench.<key>=...`; "
           "default preset of `rlhf bench ppo`: `trl-baseline`, in benchmarks/presets/).", "",
           "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in BenchConfig.model_fields.items():
        out.append(f"| `bench.{name}` | {_type(field.annotation)} | {_value(field.default)} | {field.description} |")
    return out


def metrics_section() -> list[str]:
    out = ["## Metrics", "", "Every metric, the MLflow run it is logged to, what it means and what a bad value looks "
           "like. `<name>` stands for a family of metrics."]
    for run, docs in RUNS.items():
        out += ["", f"### {RUN_TITLES[run]}", "", "| metric | meaning | bad value |", "| --- | --- | --- |"]
        out += [f"| {', '.join(f'`{n}`' for n in d.names)} | {d.meaning} | {d.bad} |" for d in docs]
    out += ["", "Every `ppo.sample_every` iterations (and the last) the PPO run also gets a table "
            "`samples/iter_NNNN.json`: prompt, response, RM score and, on the demo task, the gold score."]
    return out


def alarms_section() -> list[str]:
    return ["## PPO alarms", "", "Checked every iteration. An alarm is a warning in the Prefect log (and on the "
            "terminal), an MLflow tag `rlhf.alarm.<name>` on the PPO run (first occurrence), and a line in the eval "
            "report; with `ppo.stop_on_alarm=true` the loop ends at the first one.", "",
            "| alarm | fires when |", "| --- | --- |"] + [f"| `{k}` | {v} |" for k, v in RULES.items()]


def reference() -> str:
    lines = ["# Reference", "", "Generated from the code by `rlhf reference > docs/reference.md`; "
             "tests/test_reference.py fails when the two disagree. The user's guide is the README.", ""]
    for section in (config_section(), bench_section(), metrics_section(), alarms_section()):
        lines += section + [""]
    return "\n".join(lines)
