"""Parameters are data, and data only from where the host allows it: what a pipeline run that arrives through a
deployment (the Prefect API) may READ. `flows.code_policy` says what code it may run.

A deployment run names data and models by config keys and flow parameters. Each is refused before any stage runs
(before the pipeline's MLflow run exists), with one line naming the key, unless it is one of:

- an MLflow model URI (`models:/...`, `runs:/...`) where a model is wanted;
- a path that resolves (symlinks followed) under one of the host's roots: the project's `data/`, the state dir's
  imported models (`<state>/imported/`), and what the host adds in `RLHF_ALLOW_PATHS` (its environment, separated
  by `:` or `,`) or `<state>/allow-paths.txt` (one folder per line, `#` comments);
- a known model name (`smollm2`: imported under `<state>/imported/`);
- a hub id, only while the hub is on for this worker (none of `HF_HUB_OFFLINE`, `HF_DATASETS_OFFLINE`,
  `TRANSFORMERS_OFFLINE` is set); a `datasets` builder name (`text`, `json`, `csv`, ...) is never a hub id.

`..` in a path, `file://` and other URLs, `~`, and an absolute or parent-relative `data.hub_data_dir` are refused
whatever the roots. `rlhf run` on the command line is the host itself: its config is not checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from rlhf_lib.config import ConfigError, PipelineConfig
from rlhf_lib.data.sources import DATA_SUFFIXES, is_builder_name
from rlhf_lib.model_import import is_known
from stages.launch import CONFIG_DIR as ACCELERATE_CONFIGS

ENV = "RLHF_ALLOW_PATHS"
FILE_NAME = "allow-paths.txt"
PROJECT_DATA = Path(__file__).resolve().parent.parent / "data"
OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
MODEL_URIS = ("models:/", "runs:/")
MODEL_SUFFIXES = (".gguf", ".safetensors", ".bin")
_DATA = "a file or folder under the roots, or a hub data set while the hub is on (never a datasets builder name)"
_MODEL = "a folder or `.gguf` under the roots, a known name (`smollm2`), or a hub id while the hub is on"
_URI = "an MLflow model URI (`models:/...`, `runs:/...`) or a folder under the roots"
# Every key and flow parameter that names something a run reads, and what a deployment run may name there
# (`requests` finds them in a config; docs/operations.md's table is generated from this: flows/policy_docs.py).
READ_KEYS = (
    *((f"data.{k}", _DATA) for k in ("preferences", "sft", "prompts", "eval_preferences", "eval_prompts")),
    ("data.hub_data_dir", "a folder inside the hub data set: relative, without `..`"),
    ("model.name_or_path", _MODEL), ("reward.name_or_path", _MODEL),
    ("ppo.rewards[].model", f"kind model: {_URI}; kind judge: {_MODEL}, or an MLflow model URI"),
    ("eval.judge.model", f"kind model: {_URI}; kind judge: {_MODEL}, or an MLflow model URI"),
    ("sft_model, reward_model (flow parameters)", _URI),
    ("resources.accelerate_config", "a file of the project's `configs/accelerate/`, or a file under the roots"),
    ("preset (flow parameter)", "the name of a preset in flows/presets/ (`preset_names()`), never a path"),
)


def host_roots(state: Path) -> list[Path]:
    """The folders a deployment run may read from: the project's data/, `<state>/imported/`, and the host's own
    entries (`RLHF_ALLOW_PATHS`, `<state>/allow-paths.txt`), each resolved."""
    entries = [str(PROJECT_DATA), str(state / "imported")]
    entries += os.environ.get(ENV, "").replace(",", os.pathsep).split(os.pathsep)
    path = state / FILE_NAME
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            entries.append(line.split("#", 1)[0].strip())
    return [Path(e).expanduser().resolve() for e in entries if e.strip()]


def hub_is_on() -> bool:
    """Whether this worker may reach the Hugging Face hub (no offline switch set)."""
    return not any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_SWITCHES)


def requests(cfg: PipelineConfig, sft_model: str | None = None,
             reward_model: str | None = None) -> Iterator[tuple[str, str, str]]:
    """(key, value, what) for every key of `cfg` and flow parameter that names something to read: what is `data`
    (a data source), `model` (a model path, hub id or known name; an MLflow URI too), `uri` (an MLflow model URI, or
    a path under the roots) or `config` (a file the run reads)."""
    d = cfg.data
    for key in ("preferences", "sft", "prompts", "eval_preferences", "eval_prompts"):
        if value := getattr(d, key):
            yield f"data.{key}", value, "data"
    for section in ("model", "reward"):
        if value := getattr(cfg, section).name_or_path:
            yield f"{section}.name_or_path", value, "model"
    for i, source in enumerate(cfg.ppo.rewards):
        if source.model:
            yield f"ppo.rewards[{i}].model", source.model, "uri" if source.kind == "model" else "model"
    if (judge := cfg.eval.judge) is not None and judge.model:
        yield "eval.judge.model", judge.model, "uri" if judge.kind == "model" else "model"
    for key, value in (("sft_model", sft_model), ("reward_model", reward_model)):
        if value:
            yield key, value, "uri"
    if cfg.resources.accelerate_config:
        yield "resources.accelerate_config", cfg.resources.accelerate_config, "config"


def refusal(value: str, what: str, roots: list[Path], hub: bool) -> str | None:
    """Why a deployment run may not read `value` as a `what` (see `requests`), or None when it may."""
    if value.startswith(MODEL_URIS):
        return None if what in ("model", "uri") else "an MLflow URI is not a data source"
    if "://" in value or value.startswith("file:"):
        return "URLs (file:// and others) are not read by a deployment run"
    if value.startswith("~") or ".." in Path(value).parts:
        return "'~' and '..' are not allowed in a deployment run's paths"
    if what == "model" and is_known(value):
        return None
    if what == "config" and "/" not in value and (ACCELERATE_CONFIGS / value).is_file():  # the project's own
        return None
    path = Path(value)
    looks_local = (path.is_absolute() or path.exists() or value.startswith(".")
                   or path.suffix.lower() in DATA_SUFFIXES + MODEL_SUFFIXES)
    if looks_local or what in ("uri", "config"):
        real = path.resolve()
        if any(real == root or real.is_relative_to(root) for root in roots):
            return None
        return f"the path is outside the folders this host lets deployment runs read ({', '.join(map(str, roots))})"
    if what == "data" and is_builder_name(value):
        return f"{value!r} is a datasets builder name, not a hub data set"
    if not hub:
        return "a hub id, and the hub is off on this worker (HF_HUB_OFFLINE)"
    return None


def check_deployment_paths(cfg: PipelineConfig, state: Path, sft_model: str | None = None,
                           reward_model: str | None = None) -> None:
    """Refuse, before any stage, a deployment run that names data or models outside what the host allows: one
    `ConfigError` line naming each key."""
    roots, hub = host_roots(state), hub_is_on()
    refused = [(key, value, why) for key, value, what in requests(cfg, sft_model, reward_model)
               if (why := refusal(value, what, roots, hub))]
    hub_dir = cfg.data.hub_data_dir
    if hub_dir and (Path(hub_dir).is_absolute() or hub_dir.startswith("~") or ".." in Path(hub_dir).parts):
        refused.append(("data.hub_data_dir", hub_dir, "a folder inside the hub data set, never a path on the worker"))
    if refused:
        keys = "; ".join(f"{key}={value[:80]!r}: {why}" for key, value, why in refused)
        raise ConfigError(f"a deployment run may not read this: {keys}. The host names the folders deployment runs "
                          f"read in {ENV} or {state / FILE_NAME}")
