"""Loading a registered model back, and the identity of a configured pretrained model for cache keys."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stages.artifact_cache import download
from stages.manifest import dir_digest

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_policy(uri: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A registered policy (or SFT model) and its tokenizer from `models:/rlhf-policy/3`,
    `models:/rlhf-policy@champion` or any MLflow artifact URI, in one call."""
    from rlhf_lib.model_dirs import load_causal_lm

    return load_causal_lm(download(uri))


def model_source_digest(name_or_path: str | None, revision: str | None = None) -> str:
    """The identity of a configured pretrained model for cache keys: the content of a local directory (its files
    can change under the same path), else the hub name and revision."""
    if not name_or_path:
        return ""
    if Path(name_or_path).expanduser().is_dir():
        return "dir:" + dir_digest(Path(name_or_path).expanduser())
    return f"hub:{name_or_path}@{revision or 'default'}"
