"""Reward-model training forwards that run each distinct prompt once (`reward.share_prompts`).

A ranked list holds K responses to one prompt, so a step of B lists feeds the prompt's tokens through the model K
times. Here each distinct prompt of a step runs once with a KV cache, and its responses run on the cached keys and
values, each at the positions that follow its own prompt. Causal attention makes every response token's hidden state
the one of the whole (prompt + response) row, so the scores and their gradient (which flows back through the cache
into the prompt forward) are those of `reward.batch_scores` up to float rounding. The demo's prompts are 17 of a row's
40 tokens, so a list of 6 feeds 155 tokens through the model instead of 240.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from rlhf_lib.data.collate import pad_right, token_budget_split
from rlhf_lib.lm.scoring import cache_kwarg

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _inner(model: PreTrainedModel) -> PreTrainedModel:
    """The transformers model under a DDP (`.module`) or PEFT (`get_base_model()`) wrapper."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports_prompt_sharing(model: PreTrainedModel) -> bool:
    """Whether `model` (possibly wrapped) takes a prefilled `DynamicCache` of plain key/value layers and explicit
    position ids: true of GPT-2, GPT-NeoX, Llama, Qwen2 and most decoder-only models of transformers 5; false of
    sliding-window, linear-attention and state-space layers, whose caches cannot be cut by batch row."""
    import inspect

    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
        inner = _inner(model)
        layers = DynamicCache(config=inner.config).layers
    except (ImportError, TypeError, ValueError, KeyError, AttributeError):
        return False
    params = inspect.signature(type(inner).forward).parameters
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers) and "position_ids" in params


def prompt_groups(rows: Sequence[tuple[Sequence[int], int]]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Split encoded (ids, prompt tokens) rows into distinct prompts, responses, and each row's prompt index.

    Rows whose prompt was cut differently (`encode_prompt_response` cuts a long prompt by its response's length)
    get prompts of their own. Example: rows ([1, 2, 7], 2), ([1, 2, 8, 9], 2), ([2, 5], 1) -> prompts [[1, 2], [2]],
    responses [[7], [8, 9], [5]], prompt_of [0, 0, 1].
    """
    index: dict[tuple[int, ...], int] = {}
    responses, prompt_of = [], []
    for ids, n_prompt in rows:
        prompt_of.append(index.setdefault(tuple(ids[:n_prompt]), len(index)))
        responses.append(list(ids[n_prompt:]))
    return [list(p) for p in index], responses, prompt_of


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[rows] along dim 0, with a backward that sums the gradients of repeated rows in the same order on every run:
    on CPU `index_select` (its backward, `index_add_`, goes in index order; advanced indexing's `index_put_` does
    not), on CUDA advanced indexing (its backward sorts the indices; `index_select`'s uses atomic adds)."""
    return x[rows] if x.is_cuda else x.index_select(0, rows)


def _sliced_cache(cache, rows: torch.Tensor, config):
    """A new `DynamicCache` holding batch `rows` of `cache`'s keys and values (differentiable: the gradient of the
    copies adds up in the prompt forward's keys and values)."""
    from transformers.cache_utils import DynamicCache

    out = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        out.update(take_rows(layer.keys, rows), take_rows(layer.values, rows), i)
    return out


def shared_prompt_scores(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
    prompt_of: Sequence[int], pad_id: int, budget: int | None, device: torch.device,
) -> torch.Tensor:
    """Reward-model scores of rows prompts[prompt_of[i]] + responses[i], in the rows' order, each prompt run once.

    Prompts (right-padded) run in forwards of at most `budget` padded tokens, sorted by length; each forward's
    responses run after it on slices of its KV cache, in forwards of at most `budget` padded response tokens, with
    position ids continuing from their own prompt's length (0 on padding) and an attention mask of (prompt mask,
    response mask), so a response never sees its prompt's padding. Every forward goes through `model` (a DDP
    wrapper syncs only gradients of calls that go through it) and stays in the graph for one backward.

    Shapes: P prompts, N responses and prompt_of of length N (every prompt and response at least one token) -> (N,).
    """
    inner = _inner(model)
    kw = cache_kwarg(type(inner))
    p_len = [len(p) for p in prompts]
    chunks = [list(range(len(prompts)))] if budget is None else token_budget_split(p_len, p_len, budget)
    rows_of: dict[int, list[int]] = {}
    for i, k in enumerate(prompt_of):
        rows_of.setdefault(k, []).append(i)
    scores, order = [], []
    for chunk in chunks:
        ids, mask = pad_right([prompts[k] for k in chunk], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        if cache is None:
            raise RuntimeError(f"{type(inner).__name__} returned no KV cache (gradient checkpointing turns it off): "
                               "set reward.share_prompts: false")
        slot = {k: j for j, k in enumerate(chunk)}
        rows = [i for k in chunk for i in rows_of.get(k, [])]
        r_len = [len(responses[i]) for i in rows]
        parts = [rows] if budget is None else [[rows[j] for j in p] for p in token_budget_split(r_len, r_len, budget)]
        for part in parts:
            at = torch.tensor([slot[prompt_of[i]] for i in part], device=device)
            r_ids, r_mask = pad_right([responses[i] for i in part], pad_id)
            r_ids, r_mask = r_ids.to(device), r_mask.to(device)
            # Padding sits at position 0: a short response padded after a long prompt would run past the
            # position table (n_positions); its outputs are masked out either way.
            positions = (mask.sum(-1)[at].unsqueeze(-1) + torch.arange(r_ids.shape[1], device=device)) * r_mask
            kv = _sliced_cache(cache, at, inner.config)
            res = model(input_ids=r_ids, attention_mask=torch.cat([mask[at], r_mask], 1), position_ids=positions,
                        use_cache=True, **{kw: kv})
            scores.append(res.logits.squeeze(-1))
            order.extend(part)
    return torch.cat(scores)[torch.argsort(torch.tensor(order, device=device))]
