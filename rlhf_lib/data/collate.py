"""Tokenizing prompt + response pairs and padding them into batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model classes cost ~2 s to import; a cached run never needs them
    from transformers import PreTrainedTokenizerBase


def encode_prompt_response(
    tokenizer: PreTrainedTokenizerBase, prompt: str, response: str, max_length: int, add_eos: bool = True
) -> tuple[list[int], int]:
    """Token ids of prompt + response (+ EOS), and how many of them belong to the prompt.

    Too long a row loses prompt tokens from the left first (the end of a dialogue matters most), keeping at least
    half of `max_length` for it, then response tokens from the right. The EOS is kept when the response is cut:
    the model must still see where an answer ends.
    """
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"]
    if add_eos:
        r = r + [tokenizer.eos_token_id]
    overflow = len(p) + len(r) - max_length
    if overflow > 0:
        cut_p = min(overflow, max(0, len(p) - max_length // 2))
        p = p[cut_p:]
        overflow -= cut_p
    if overflow > 0:
        keep = len(r) - overflow
        r = r[: keep - 1] + r[-1:] if add_eos else r[:keep]
    return p + r, len(p)


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists. Returns ids (N, T) and attention mask (N, T)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], responses: Sequence[str], max_length: int
) -> dict[str, torch.Tensor]:
    """A causal-LM batch whose labels cover response tokens only (prompt and padding are -100)."""
    encoded = [encode_prompt_response(tokenizer, p, r, max_length) for p, r in zip(prompts, responses)]
    ids, mask = pad_right([e[0] for e in encoded], tokenizer.pad_token_id)
    labels = ids.clone()
    for i, (_, n_prompt) in enumerate(encoded):
        labels[i, :n_prompt] = -100
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
