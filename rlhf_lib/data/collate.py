"""Tokenizing prompt + response pairs and padding them into batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
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
    cut_p, cut_r = cuts(len(p), len(r), max_length)
    p = p[cut_p:]
    if cut_r:
        keep = len(r) - cut_r
        r = r[: keep - 1] + r[-1:] if add_eos else r[:keep]
    return p + r, len(p)


def cuts(n_prompt: int, n_response: int, max_length: int) -> tuple[int, int]:
    """Tokens cut from the left of the prompt and from the right of the response so that both fit `max_length`:
    the prompt first, down to half of `max_length`, then the response.

    >>> cuts(10, 4, 8)  # 6 too many: the prompt gives 6 (keeping 4 >= 8 // 2), the response nothing
    (6, 0)
    >>> cuts(10, 8, 8)  # 10 too many: the prompt gives 6, the response 4
    (6, 4)
    """
    overflow = n_prompt + n_response - max_length
    cut_p = min(max(overflow, 0), max(0, n_prompt - max_length // 2))
    return cut_p, max(overflow - cut_p, 0)


def truncation_counts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], responses: Sequence[str],
                      max_length: int) -> dict[str, int]:
    """How many (prompt, response + EOS) rows `encode_prompt_response` cuts: {"prompts": rows whose prompt loses
    tokens on the left, "responses": rows whose response loses tokens on the right}."""
    n_p = [len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
    n_r = [len(ids) + 1 for ids in tokenizer(list(responses), add_special_tokens=False)["input_ids"]]
    both = [cuts(a, b, max_length) for a, b in zip(n_p, n_r)]
    return {"prompts": sum(c > 0 for c, _ in both), "responses": sum(c > 0 for _, c in both)}


def prompt_truncations(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_prompt_tokens: int) -> int:
    """How many prompts lose tokens on the left when kept to their last `max_prompt_tokens` (PPO, eval)."""
    lengths = (len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"])
    return sum(n > max_prompt_tokens for n in lengths)


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists. Returns ids (N, T) and attention mask (N, T)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def token_budget_split(lengths: Sequence[int], widths: Sequence[int], budget: int) -> list[list[int]]:
    """Micro-batches of row indices whose padded size fits `budget` tokens: rows sorted by length, each micro-batch
    as many consecutive rows as keep (rows x its longest row) <= budget, at least one row.

    `lengths[i]` orders the rows; `widths[i]` is what row i adds to the padded width (prompt + response tokens).
    Sorting puts rows of similar length together, so short rows do not pay for a long row's padding."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    parts: list[list[int]] = []
    current: list[int] = []
    widest = 0
    for i in order:
        w = max(widest, widths[i])
        if current and (len(current) + 1) * w > budget:
            parts.append(current)
            current, w = [], widths[i]
        current.append(i)
        widest = w
    if current:
        parts.append(current)
    return parts


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], responses: Sequence[str], max_length: int
) -> dict[str, torch.Tensor]:
    """A causal-LM batch whose labels cover response tokens only (prompt and padding are -100)."""
    encoded = [encode_prompt_response(tokenizer, p, r, max_length) for p, r in zip(prompts, responses)]
    return sft_rows(encoded, tokenizer.pad_token_id)


def sft_rows(encoded: Sequence[tuple[Sequence[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """`sft_batch` of rows already encoded as (ids, prompt tokens), the pairs `encode_prompt_response` returns.
    Shapes: input_ids, attention_mask, labels (N, T)."""
    ids, mask = pad_right([e[0] for e in encoded], pad_id)
    labels = ids.clone()
    for i, (_, n_prompt) in enumerate(encoded):
        labels[i, :n_prompt] = -100
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def truncation_notice(stage: str, cut: dict[str, int], rows: int, key: str, max_length: int) -> str | None:
    """The warning a stage logs when `truncation_counts` found rows it cuts (None when it cuts none): a prompt cut on
    the left loses the question, a response cut on the right its end, silently to the loss."""
    if not cut["prompts"] and not cut["responses"]:
        return None
    return (f"{stage}: at {key}={max_length} tokens, {cut['prompts']} of {rows} rows lose the start of their prompt "
            f"and {cut['responses']} the end of their response: raise {key} (model.n_positions caps it)")
