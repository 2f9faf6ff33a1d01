"""Batched sampling with a KV cache, temperature and EOS stop; the log-probs come from the sampling step.

Our own loop rather than `generate()`: it returns the log-prob of each sampled token at the sampling temperature
in the same pass (no second policy forward, as TRL does with `output_scores`), stops as soon as every row has
emitted EOS, and costs one model call per token with no per-step logits processors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from rlhf_lib.ppo.scoring import cache_kwarg, keep_last, position_ids

if TYPE_CHECKING:  # transformers' model classes cost ~2 s to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.ppo.distributed import RowShard


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample responses to left-padded queries.

    Shapes: query, query_mask (B, P) -> response (B, R), response_mask (B, R), logprobs (B, R) with
    R <= max_new_tokens (the loop ends once every row has emitted EOS). After a row's EOS its tokens are PAD,
    its mask 0 and its log-probs 0. The EOS itself is a real token (mask 1): the policy must get credit for
    stopping. With `stop_at_eos=False` every row runs `max_new_tokens` tokens (benchmarks). With `shard` (under
    `accelerate launch`) the rows are this process's slice of a global batch, and the tokens and the number of
    steps are those of sampling the whole batch in one process (see `rlhf_lib.ppo.distributed`).
    """
    b = query.shape[0]
    kw = cache_kwarg(type(policy))
    attn = query_mask.long()
    pos = position_ids(attn)
    out = policy(input_ids=query, attention_mask=attn, position_ids=pos, use_cache=True, **keep_last(policy, 1))
    next_pos = pos[:, -1:] + 1
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    logits = out.logits[:, -1]  # (B, V)

    done = torch.zeros(b, dtype=torch.bool)
    tokens, logps, masks = [], [], []
    for step in range(max_new_tokens):
        scaled = logits.float() / temperature
        logp_all = torch.log_softmax(scaled, dim=-1)  # (B, V)
        probs = logp_all.exp()
        tok = shard.draw(probs, generator) if shard else torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        logp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        alive = ~done
        tokens.append(torch.where(alive, tok, torch.full_like(tok, pad_token_id)))
        logps.append(torch.where(alive, logp, torch.zeros_like(logp)))
        masks.append(alive.long())
        if stop_at_eos:
            done = done | (tok == eos_token_id)
        if (shard.all_done(done) if shard else bool(done.all())) or step == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((b, 1), dtype=attn.dtype)], 1)
        out = policy(input_ids=tokens[-1].unsqueeze(-1), attention_mask=attn, position_ids=next_pos,
                     use_cache=True, **{kw: cache})
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        next_pos = next_pos + 1
        logits = out.logits[:, -1]
    return torch.stack(tokens, 1), torch.stack(masks, 1), torch.stack(logps, 1)


def decode_responses(tokenizer: PreTrainedTokenizerBase, response: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """Text of each response without EOS or padding."""
    out = []
    for ids, m in zip(response.tolist(), response_mask.tolist()):
        real = [t for t, keep in zip(ids, m) if keep and t != tokenizer.eos_token_id]
        out.append(tokenizer.decode(real, skip_special_tokens=True))
    return out


def ends_with_eos(response: torch.Tensor, response_mask: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Whether each response stopped with EOS (rather than running out of tokens). Shape: (B, R) -> (B,) bool."""
    return ((response == eos_token_id) & response_mask.bool()).any(-1)
