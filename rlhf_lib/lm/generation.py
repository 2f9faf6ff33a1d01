"""Batched sampling with a KV cache, temperature and EOS stop; the log-probs come from the sampling step.

Our own loop rather than `generate()`: it returns the log-prob of each sampled token at the sampling temperature
in the same pass (no second policy forward, as TRL does with `output_scores`), stops as soon as every row has
emitted EOS, and costs one model call per token with no per-step logits processors.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Protocol

import torch

from rlhf_lib.lm.scoring import cache_kwarg, keep_last, position_ids

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class RowShard(Protocol):
    """This process's rows of a batch sampled across processes (`rlhf_lib.distributed.RowShard`, from
    `ProcessGroup.row_shard`): the uniforms of its rows, drawn as the whole batch would draw them, and whether every row of every
    process has stopped."""

    def uniforms(self, steps: int, n: int, generator: torch.Generator | None) -> torch.Tensor: ...

    def all_done(self, done: torch.Tensor) -> bool: ...


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_prompt_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize prompts, keep the last `max_prompt_tokens` of each (the end of a dialogue matters most) and
    left-pad them with PAD, so that every row's next token is generated at the same column.

    Returns query (B, P) and query_mask (B, P).
    """
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"][-max_prompt_tokens:] for p in prompts]
    if any(len(r) == 0 for r in rows):
        raise ValueError("a prompt tokenized to zero tokens")
    width = max(len(r) for r in rows)
    query = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        query[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return query, mask


@cache
def _preallocated_layer_class() -> type:
    """A transformers `DynamicLayer` whose keys and values live in buffers sized for the whole rollout: each step
    writes its slice in place and attention reads a view, instead of `torch.cat` copying the whole cache."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            b, h, _, dk = key_states.shape
            self._k = key_states.new_empty(b, h, self.capacity, dk)  # (B, H, capacity, D)
            self._v = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
            self.keys, self.values = self._k[:, :, :0], self._v[:, :, :0]
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, m = self.keys.shape[-2], self.keys.shape[-2] + key_states.shape[-2]
            if m > self.capacity:
                raise RuntimeError(f"KV cache of {self.capacity} positions overflows at {m}")
            self._k[:, :, n:m].copy_(key_states)
            self._v[:, :, n:m].copy_(value_states)
            self.keys, self.values = self._k[:, :, :m], self._v[:, :, :m]
            return self.keys, self.values

    return PreallocatedLayer


def preallocated_cache(policy: PreTrainedModel, capacity: int):
    """A `DynamicCache` for `policy` whose full-attention layers are preallocated for `capacity` positions; other
    layer kinds (sliding window, linear attention) keep their own class. None for a model without the Cache API."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
        kv = DynamicCache(config=policy.config)
    except (ImportError, TypeError, ValueError, KeyError, AttributeError):
        return None
    layer_cls = _preallocated_layer_class()
    kv.layers = [layer_cls(capacity) if type(layer) is DynamicLayer else layer for layer in kv.layers]
    return kv if kv.layers else None


def _draw(logp_all: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds u. Shapes: (B, V), (B,) -> (B,).

    Exact for the categorical distribution, and one uniform per row instead of `torch.multinomial`'s one
    exponential per vocabulary entry (which dominated the step's sampling time on CPU). A token of
    probability 0 never comes out: its cumulative sum equals its predecessor's.
    """
    cdf = logp_all.exp().cumsum(-1)  # (B, V)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return tok.clamp_(max=logp_all.shape[-1] - 1)


class Decoder(Protocol):
    """How `sample` gets each next-token distribution from the model: `prompt_width` may widen the prompt (left
    padding, so a compiled decoder sees a handful of shapes), `prefill` runs the prompt and `step` one token on the
    decoder's KV cache. The attention mask `attn` (B, W + R) holds 1 up to the newest token and 0 after it; each
    returns the last position's logits (B, V). `EagerDecoder` and `rlhf_lib.lm.compiled.CompiledDecoder` are the two."""

    def prompt_width(self, p: int) -> int: ...

    def prefill(self, policy: PreTrainedModel, query: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
                capacity: int) -> torch.Tensor: ...

    def step(self, token: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, n: int) -> torch.Tensor: ...


class EagerDecoder:
    """One eager model call per token on a preallocated `DynamicCache` (nothing copied as it grows), the mask read
    up to the newest token. One sampling call's state: a fresh one per call."""

    def prompt_width(self, p: int) -> int:
        return p

    def prefill(self, policy, query, attn, pos, capacity):
        self.policy, self.kw = policy, cache_kwarg(type(policy))
        kv = preallocated_cache(policy, capacity)
        p = query.shape[1]
        self.out = policy(input_ids=query, attention_mask=attn[:, :p], position_ids=pos, use_cache=True,
                          **({self.kw: kv} if kv is not None else {}), **keep_last(policy, 1))
        return self.out.logits[:, -1]

    def step(self, token, attn, pos, n):
        cache_now = getattr(self.out, "cache", None) or getattr(self.out, "past_key_values", None)
        self.out = self.policy(input_ids=token, attention_mask=attn[:, : n + 1], position_ids=pos, use_cache=True,
                               **{self.kw: cache_now})
        return self.out.logits[:, -1]


@torch.inference_mode()
def sample(
    policy: PreTrainedModel,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    eos_token_id: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    stop_at_eos: bool = True,
    shard: RowShard | None = None,
    decoder: Decoder | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample responses to left-padded queries.

    Shapes: query, query_mask (B, P) -> response (B, R), response_mask (B, R), logprobs (B, R) with
    R <= max_new_tokens (the loop ends once every row has emitted EOS). After a row's EOS its tokens are PAD,
    its mask 0 and its log-probs 0. The EOS itself is a real token (mask 1): the policy must get credit for
    stopping. With `stop_at_eos=False` every row runs `max_new_tokens` tokens (benchmarks). With `shard` (under
    `accelerate launch`) the rows are this process's slice of a global batch, and the tokens and the number of
    steps are those of sampling the whole batch in one process (`rlhf_lib.distributed.RowShard`).

    Per token: one model call through the `decoder` (default `EagerDecoder`; `ppo.rollout_engine: compiled` gives a
    `CompiledDecoder`), a log-softmax of (B, V), and a write into preallocated outputs. The uniforms for all steps are
    drawn at once from `generator` (on CPU, so a seed gives the same samples on every device). Outputs are on the
    policy's device.
    """
    device = next(policy.parameters()).device
    dec = decoder if decoder is not None else EagerDecoder()
    b, p = query.shape
    width = dec.prompt_width(p)
    if width > p:  # more left padding: the prompt's tokens keep their positions (position_ids count real tokens)
        query = torch.cat([query.new_full((b, width - p), pad_token_id), query], 1)
        query_mask = torch.cat([query_mask.new_zeros((b, width - p)), query_mask], 1)
    u = (shard.uniforms(max_new_tokens, b, generator) if shard
         else torch.rand((max_new_tokens, b), generator=generator)).to(device)  # (R, B)
    attn = torch.zeros((b, width + max_new_tokens), dtype=torch.long, device=device)  # (B, W+R): 1 up to each step
    attn[:, :width] = query_mask
    pos = position_ids(attn[:, :width])
    logits = dec.prefill(policy, query.to(device), attn, pos, width + max_new_tokens)
    next_pos = pos[:, -1:] + 1

    tokens = torch.full((b, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    logps = torch.zeros((b, max_new_tokens), device=device)
    masks = torch.zeros((b, max_new_tokens), dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    steps = max_new_tokens
    for step in range(max_new_tokens):
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, V)
        tok = _draw(logp_all, u[step])
        logp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        if stop_at_eos:
            alive = ~done
            tokens[:, step] = torch.where(alive, tok, pad_token_id)
            logps[:, step] = torch.where(alive, logp, 0.0)
            masks[:, step] = alive
            done = done | (tok == eos_token_id)
            if shard.all_done(done) if shard else bool(done.all()):
                steps = step + 1
                break
        else:
            tokens[:, step], logps[:, step], masks[:, step] = tok, logp, 1
        if step == max_new_tokens - 1:
            break
        attn[:, width + step] = 1
        logits = dec.step(tokens[:, step : step + 1], attn, next_pos, width + step)
        next_pos = next_pos + 1
    return tokens[:, :steps], masks[:, :steps], logps[:, :steps]


def decode_responses(tokenizer: PreTrainedTokenizerBase, response: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """Text of each response without EOS or padding."""
    out = []
    for ids, m in zip(response.tolist(), response_mask.tolist()):
        real = [t for t, keep in zip(ids, m) if keep and t != tokenizer.eos_token_id]
        out.append(tokenizer.decode(real, skip_special_tokens=True))
    return out


def ends_with_eos(response: torch.Tensor, response_mask: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Whether each response's last real token is EOS (it stopped rather than running out of tokens); in a
    multi-turn rollout the EOS of an earlier turn does not count. Shape: (B, R) -> (B,) bool."""
    m = response_mask.bool()
    if m.shape[1] == 0:
        return torch.zeros(m.shape[0], dtype=torch.bool, device=m.device)
    last = (m * torch.arange(1, m.shape[1] + 1, device=m.device)).argmax(dim=1, keepdim=True)
    return (response.gather(1, last).squeeze(1) == eos_token_id) & m.any(dim=1)
