"""Forward passes over prompt + response: log-probs, entropy, values and reward-model scores.

Layout of every sequence: `[query (left-padded, P) | response (right-padded, R)]`. Position ids come from the
attention mask, so left padding does not shift positions. Only the R positions that predict response tokens are
projected to the vocabulary: the prompt positions never pay for the (T, V) matmul.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import TYPE_CHECKING

import torch

from rlhf_lib.ppo.losses import entropy_from_logits

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Shape: (B, T) -> (B, T). Position of each token counted over real tokens only (0 on left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@cache
def cache_kwarg(model_cls: type) -> str:
    """Name of the KV-cache argument: `cache` in transformers 5, `past_key_values` before."""
    params = inspect.signature(model_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def concat(query: torch.Tensor, query_mask: torch.Tensor, response: torch.Tensor, response_mask: torch.Tensor):
    """Shapes: (B, P), (B, P), (B, R), (B, R) -> ids (B, P+R), mask (B, P+R), on the response's device (prompts
    are tokenized on the CPU; responses come from the policy's device)."""
    dev = response.device
    return (torch.cat([query.to(dev), response], 1),
            torch.cat([query_mask.to(dev).long(), response_mask.long()], 1))


def backbone_hidden(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states of the model's transformer body. Shape: (B, T) -> (B, T, H)."""
    body = model.base_model
    out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
               **no_cache(body))
    return out.last_hidden_state


def response_hidden(
    model: PreTrainedModel,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """Hidden states of the positions that predict each response token. Shape: (B, R, H).

    Position P-1+t predicts response token t, so the hidden states [P-1, P+R-1) are kept.
    """
    ids, mask = concat(query, query_mask, response, response_mask)
    p, r = query.shape[1], response.shape[1]
    return backbone_hidden(model, ids, mask)[:, p - 1 : p + r - 1]


def response_logits(
    model: PreTrainedModel,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """Logits / temperature that predict each response token, in float32. Shape: (B, R, V).

    The model's own forward computes them (so any head-side logic such as logit soft-capping or scaling applies,
    exactly as in sampling), projecting only the last R+1 positions: the prompt positions never pay for the
    vocabulary matmul. The temperature is the sampling one: log-probs at another temperature would make the PPO
    ratio and the KL wrong (N+ implementation details).
    """
    ids, mask = concat(query, query_mask, response, response_mask)
    r = response.shape[1]
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), **keep_last(model, r + 1),
                **no_cache(model))
    return out.logits[:, -(r + 1) : -1].float() / temperature  # (B, R, V)


@cache
def _forward_params(model_cls: type) -> tuple[frozenset[str], bool]:
    """Names of the forward's parameters, and whether it also takes **kwargs."""
    params = inspect.signature(model_cls.forward).parameters
    return frozenset(params), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _unwrapped(model: PreTrainedModel) -> type:
    """The class whose signature counts: a DDP wrapper passes keyword arguments on to its `.module`."""
    return type(getattr(model, "module", model))


def keep_last(model: PreTrainedModel, n: int) -> dict[str, int]:
    """`logits_to_keep=n` where the model supports it (most transformers causal LMs do), else nothing."""
    return {"logits_to_keep": n} if "logits_to_keep" in _forward_params(_unwrapped(model))[0] else {}


def no_cache(model: PreTrainedModel) -> dict[str, bool]:
    """`use_cache=False` for a pass over whole sequences (scoring, training), where the model takes it: without
    it transformers 5 builds a KV cache in every such forward, copying each layer's keys and values into it for
    nothing. A wrapper that passes **kwargs on (PEFT) gets it too."""
    names, var_kw = _forward_params(_unwrapped(model))
    return {"use_cache": False} if "use_cache" in names or var_kw else {}


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[tokens] without materialising a second (B, R, V) tensor.

    Shapes: logits (B, R, V), tokens (B, R) -> (B, R). Uses logit[token] - logsumexp(logits).
    """
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def response_logprobs(
    model: PreTrainedModel,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of the response (and the policy's entropy). Shapes: (B, R) each, 0 on padding."""
    logits = response_logits(model, query, query_mask, response, response_mask, temperature)
    m = response_mask.to(logits.dtype)
    logprobs = gather_logprobs(logits, response) * m
    entropy = entropy_from_logits(logits) * m if with_entropy else None
    return logprobs, entropy


def token_values(
    model: PreTrainedModel,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """V(s_t): the value head on the state before each response token. Shape: (B, R), 0 on padding."""
    hidden = response_hidden(model, query, query_mask, response, response_mask)  # (B, R, H)
    return model.score(hidden).squeeze(-1) * response_mask.to(hidden.dtype)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row, for left and right padding alike. Shape: (B, T) -> (B,)."""
    t = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (t * attention_mask.long()).argmax(-1)


def sequence_scores(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar score of each sequence, read at its last real token (never on padding). Shape: (B, T) -> (B,)."""
    hidden = backbone_hidden(model, input_ids, attention_mask)  # (B, T, H)
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_token_index(attention_mask)]  # (B, H)
    return model.score(last).squeeze(-1)

