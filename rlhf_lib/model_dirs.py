"""The stages' models as plain Hugging Face directories (safetensors weights + tokenizer), saved and loaded back."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlhf_lib.models import (
    build_policy,
    build_scalar_model,
    load_tokenizer,
    same_tokenizer,
)

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def load_causal_lm(path: Path, trust_remote_code: bool = False, dtype: torch.dtype | str = torch.float32
                   ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    return build_policy(tokenizer, str(path), trust_remote_code=trust_remote_code, dtype=dtype), tokenizer


def load_scalar(path: Path, trust_remote_code: bool = False, dtype: torch.dtype | str = torch.float32
                ) -> PreTrainedModel:
    return build_scalar_model(path, trust_remote_code=trust_remote_code, dtype=dtype)


def load_reward_side(reward_dir: Path, policy: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     trust_remote_code: bool = False, dtype: torch.dtype | str = torch.float32,
                     frozen_dtype: torch.dtype = torch.float32):
    """The frozen RM (weights in `frozen_dtype`), PPO's value model (trained: in `dtype`) and the RM's tokenizer
    (None when it is the policy's).

    The value model reads the policy's token ids: it starts from the RM when both share a tokenizer (InstructGPT),
    else from a copy of the policy with a fresh scalar head.
    """
    reward = load_scalar(reward_dir, trust_remote_code, frozen_dtype)
    reward_tokenizer = load_tokenizer(reward_dir, trust_remote_code=trust_remote_code)
    if same_tokenizer(tokenizer, reward_tokenizer):
        return reward, load_scalar(reward_dir, trust_remote_code, dtype), None
    return reward, build_scalar_model(policy), reward_tokenizer
