"""Saving and loading the stages' models as plain Hugging Face directories (safetensors + tokenizer)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlhf_lib.models import build_policy, build_scalar_model, load_tokenizer

if TYPE_CHECKING:  # transformers' model classes cost ~2 s to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def fit_length(max_length: int, model: PreTrainedModel) -> int:
    """A configured sequence length, capped at what the model's position embeddings cover."""
    return min(max_length, model.config.max_position_embeddings)


def load_causal_lm(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = load_tokenizer(path)
    return build_policy(tokenizer, str(path)), tokenizer


def load_scalar(path: Path) -> PreTrainedModel:
    return build_scalar_model(path)


def load_policy(uri: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A registered policy (or SFT model) and its tokenizer from `models:/rlhf-policy/3`,
    `models:/rlhf-policy@champion` or any MLflow artifact URI, in one call."""
    from stages.tracking import download

    return load_causal_lm(download(uri))
