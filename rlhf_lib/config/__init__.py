"""Typed configuration: one pydantic model per stage, nested in `PipelineConfig`.

Every field has a description (it is the help text in the Prefect UI form and in the README). Unknown keys and
wrong types are errors: `extra="forbid"` plus pydantic's strict-enough coercion. Derived sizes (minibatch size,
number of pairs per ranked list, ...) are computed where they are used, never set here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, model_validator

from rlhf_lib.config.base import ConfigError, Section
from rlhf_lib.config.data import COLUMN_NAMES, DataConfig, ModelConfig
from rlhf_lib.config.ppo import PPOConfig
from rlhf_lib.config.dpo import DPOConfig
from rlhf_lib.config.stages import EvalConfig, ResourcesConfig, RewardConfig, SFTConfig

__all__ = ["COLUMN_NAMES", "ConfigError", "DPOConfig", "DataConfig", "EvalConfig", "ModelConfig", "PPOConfig",
           "PipelineConfig", "ResourcesConfig", "RewardConfig", "SFTConfig", "Section", "build_config", "deep_merge",
           "set_dotted"]


class PipelineConfig(Section):
    """The whole pipeline: the Prefect flow's parameter and the CLI's config."""

    name: str = Field("demo", description="Run name; shows in Prefect flow-run names and MLflow run names.")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    torch_threads: int = Field(2, ge=1, description="torch intra-op threads, set once per process.")

    @model_validator(mode="after")
    def _supervised_lora_in_one_process(self) -> "PipelineConfig":
        r = self.resources
        for stage in ("sft", "reward", "dpo"):
            if getattr(self, stage).lora and (r.num_processes > 1 or r.num_machines > 1):
                raise ValueError(f"{stage}.lora trains in one process: set resources.num_processes=1 (and "
                                 "resources.num_machines=1), or turn it off")
        return self

    @model_validator(mode="after")
    def _no_sft_needs_a_pretrained_model(self) -> "PipelineConfig":
        if self.sft.max_steps == 0 and not self.model.name_or_path:
            raise ValueError("sft.max_steps=0 keeps the base model untrained: it needs a pretrained "
                             "model.name_or_path (a model built from scratch must be trained)")
        return self

    @model_validator(mode="after")
    def _room_for_prompts(self) -> "PipelineConfig":
        # Prompt + response must fit the position embeddings; leave at least 8 tokens of prompt.
        for section in ("ppo", "eval"):
            new = getattr(self, section).max_new_tokens
            if new > self.model.n_positions - 8:
                raise ValueError(f"{section}.max_new_tokens ({new}) leaves no room for the prompt in "
                                 f"model.n_positions ({self.model.n_positions}); keep it <= n_positions - 8")
        return self


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `tree["a"]["b"] = value` for `dotted == "a.b"`, creating sub-dicts as needed."""
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ValueError(f"config key {'.'.join(keys[:-1])!r} is a value, not a section")
        node = child
    node[keys[-1]] = value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; `override` wins. Neither input is modified."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _format_errors(err: Any, origin: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.append(f"{origin}: unknown config key '{key}'")
        elif not key or isinstance(e.get("input"), dict):  # a check across keys: its message names them
            lines.append(f"{origin}: {msg}" if not key else f"{origin}: config section '{key}': {msg}")
        else:
            got = repr(e.get("input"))
            lines.append(f"{origin}: config key '{key}': {msg} (got {got if len(got) <= 80 else got[:77] + '...'})")
    return "\n".join(lines)


def build_config(layers: list[tuple[str, dict[str, Any]]], sets: Sequence[str] = (),
                 schema: type[PipelineConfig] = PipelineConfig) -> PipelineConfig:
    """Merge config layers (e.g. preset, then file) and `key=value` overrides, then validate against `schema`
    (`PipelineConfig`, or a subclass with more sections).

    Each layer is (origin, dict); the origin names the file in errors. Values of `--set` are parsed as YAML
    scalars, so `ppo.kl_coef=0.1` is a float and `ppo.adaptive_kl=false` a bool.
    """
    from pydantic import ValidationError

    from rlhf_lib.config.yaml_text import parse_yaml

    merged: dict[str, Any] = {}
    for origin, layer in layers:
        if not isinstance(layer, dict):
            raise ConfigError(f"{origin}: expected a mapping of config keys, got {type(layer).__name__}")
        merged = deep_merge(merged, layer)
        try:
            schema.model_validate(merged)
        except ValidationError as e:
            raise ConfigError(_format_errors(e, origin)) from None
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. ppo.kl_coef=0.1")
        try:
            set_dotted(merged, key.strip(), parse_yaml(raw, f"--set {item!r}") if raw.strip() else raw)
        except ValueError as e:
            raise ConfigError(f"--set {item!r}: {e}") from None
    try:
        return schema.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, "--set" if sets else "config")) from None
