"""How the commands build a config: a named preset, then an optional YAML file, then `--set key=value` overrides,
validated as one typed config (`rlhf_lib.config.build_config`). Errors are `ConfigError`s naming the file or key."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_lib.config import ConfigError, PipelineConfig, build_config
from rlhf_lib.config.advice import tiny_defaults

PRESETS = Path(__file__).resolve().parent / "presets"


def preset_names(dirs: Sequence[Path] = (PRESETS,)) -> list[str]:
    return sorted({p.stem for d in dirs for p in d.glob("*.yaml")})


def preset_layer(name: str, dirs: Sequence[Path] = (PRESETS,)) -> tuple[str, dict[str, Any]]:
    """The preset `name` as a config layer (origin, values), from the first of `dirs` that has it. A preset is a name
    that `preset_names` lists, never a path: `/x/y` or `../z` (a deployment parameter) is refused before any file is
    read."""
    known = preset_names(dirs)
    path = next((d / f"{name}.yaml" for d in dirs if (d / f"{name}.yaml").is_file()), None) if name in known else None
    if path is None:
        raise ConfigError(f"unknown preset {name[:80]!r}; known presets: {', '.join(known)}")
    return f"preset {name}", _read_yaml(path)


def file_layer(path: str) -> tuple[str, dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return str(p), _read_yaml(p)


def _read_yaml(path: Path) -> dict[str, Any]:
    from rlhf_lib.config.yaml_text import read_yaml

    return read_yaml(path) or {}


def load_config(preset: str, config_file: str | None = None, sets: Sequence[str] = (),
                schema: type[PipelineConfig] = PipelineConfig, dirs: Sequence[Path] = (PRESETS,)) -> PipelineConfig:
    layers = [preset_layer(preset, dirs)] + ([file_layer(config_file)] if config_file else [])
    cfg = build_config(layers, sets, schema)
    advise(cfg)
    return cfg


class TinyDefaultsWarning(UserWarning):
    """A pretrained model with a key still sized for the built-in tiny GPT-2 (`rlhf_lib.config.advice`)."""


class HostPrecisionWarning(UserWarning):
    """bf16 asked of a CPU without bf16 instructions (`rlhf_lib.host_bf16`): valid, and tens of times slower."""


def advise(cfg: PipelineConfig) -> None:
    """Warn (stderr, so `--json` output stays clean) about keys sized for the tiny model while a pretrained one is
    loaded (the run is valid, only likely to diverge or to cut every row short), and about bf16 on a CPU that
    emulates it."""
    for message in tiny_defaults(cfg):
        warnings.warn(message, TinyDefaultsWarning, stacklevel=3)
    for message in host_advice(cfg):
        warnings.warn(message, HostPrecisionWarning, stacklevel=3)


def host_advice(cfg: PipelineConfig) -> list[str]:
    """This host's advice on the config: bf16 where the stages would run on a CPU without bf16 instructions."""
    from rlhf_lib.host_bf16 import bf16_advice, bf16_keys, native_bf16

    if not bf16_keys(cfg):
        return []  # float32: no need to ask torch where the stages run
    from rlhf_lib.memory import on_cpu

    return bf16_advice(cfg, on_cpu(cfg.resources), native_bf16())
