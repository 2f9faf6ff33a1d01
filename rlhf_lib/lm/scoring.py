"""Forward passes over prompt + response: log-probs, entropy, values and reward-model scores.

Layout of every sequence: `[query (left-padded, P) | response (right-padded, R)]`. Position ids come from the
attention mask, so left padding does not shift positions. Only the R positions that predict response tokens are
projected to the vocabulary: the prompt positions never pay for the (T, V) matmul. With a chunk size
(`ppo.logprob_chunk`) the projection runs over `chunk` response positions at a time, so at most one (B, chunk, V)
float32 block of logits exists at once, also in training (each chunk is recomputed in the backward pass).
Every score, value and log-prob comes back in float32, whatever the models' dtype or autocast.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import TYPE_CHECKING, Literal

import torch

from rlhf_lib.lm.entropy import entropy_from_logits

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


def response_states(model: PreTrainedModel, query: torch.Tensor, query_mask: torch.Tensor, response: torch.Tensor,
                    response_mask: torch.Tensor) -> torch.Tensor:
    """Final hidden states (after the last norm) of the positions that predict each response token. Shape: (B, R, H).

    Without autograd (rollout, scoring) the transformer body runs alone and only its last states are kept. With it,
    the model's own forward runs (so a DDP wrapper sees the call and synchronises the gradients), asking for one
    position of logits only; transformers returns the final normed states as `hidden_states[-1]` (pinned by the
    chunked-vs-full test), and the other layers' states are the activations the backward keeps anyway.
    """
    p, r = query.shape[1], response.shape[1]
    if not torch.is_grad_enabled():
        return response_hidden(_causal_lm(model), query, query_mask, response, response_mask)
    ids, mask = concat(query, query_mask, response, response_mask)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), output_hidden_states=True,
                **keep_last(model, 1), **no_cache(model))
    return out.hidden_states[-1][:, p - 1 : p + r - 1]


def _causal_lm(model: PreTrainedModel) -> PreTrainedModel:
    """The transformers model inside a DDP (`.module`) or PEFT (`get_base_model()`, LoRA layers in place) wrapper."""
    inner = getattr(model, "module", model)
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def output_head(model: PreTrainedModel):
    """hidden (..., H) -> logits (..., V) as the model's own head computes them: the output embedding, then the
    final-logit soft-capping of models that have one (Gemma 2). Through DDP (`.module`) and PEFT wrappers."""
    inner = _causal_lm(model)
    head = inner.get_output_embeddings()
    cap = getattr(inner.config, "final_logit_softcapping", None)
    if cap:
        return lambda h: torch.tanh(head(h) / cap) * cap
    return head


Entropy = Literal["none", "detached", "grad"]


def chunked_logprobs(
    head,
    hidden: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float,
    chunk: int,
    entropy: Entropy = "none",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response from its hidden states, `chunk` positions at a time.

    Shapes: hidden (B, R, H), response, response_mask (B, R) -> log-probs (B, R), entropy (B, R) or None; 0 on
    padding, float32. Each chunk's logits are (B, chunk, V) float32 / temperature. Under autograd each chunk runs in
    `torch.utils.checkpoint`: its logits are freed after the forward and recomputed in the backward, so one chunk's
    (B, chunk, V) block is alive at a time instead of the whole (B, R, V). `entropy`: none, detached (logged only,
    no gradient) or grad (the entropy bonus).
    """
    from torch.utils.checkpoint import checkpoint

    def part(h: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head(h).float() / temperature  # (B, c, V)
        lp = gather_logprobs(logits, tokens)
        if entropy == "none":
            return lp, lp.new_zeros(())
        return lp, entropy_from_logits(logits if entropy == "grad" else logits.detach())

    grad = torch.is_grad_enabled() and hidden.requires_grad
    lps, ents = [], []
    for i in range(0, hidden.shape[1], chunk):
        args = (hidden[:, i : i + chunk], response[:, i : i + chunk])
        lp, ent = checkpoint(part, *args, use_reentrant=False) if grad else part(*args)
        lps.append(lp)
        ents.append(ent)
    m = response_mask.to(torch.float32)
    logprobs = torch.cat(lps, 1) * m if lps else hidden.new_zeros(response.shape, dtype=torch.float32)
    if entropy == "none":
        return logprobs, None
    return logprobs, (torch.cat(ents, 1) * m if ents else torch.zeros_like(logprobs))


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
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of the response (and the policy's entropy). Shapes: (B, R) each, 0 on padding, float32.
    `chunk`: response positions projected to the vocabulary at a time (`chunked_logprobs`); None: all at once
    through the model's own forward."""
    if chunk is not None:
        hidden = response_states(model, query, query_mask, response, response_mask)
        return chunked_logprobs(output_head(model), hidden, response, response_mask, temperature, chunk,
                                "grad" if with_entropy else "none")
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
    """V(s_t): the value head on the state before each response token. Shape: (B, R) float32, 0 on padding."""
    hidden = response_hidden(model, query, query_mask, response, response_mask)  # (B, R, H)
    return model.score(hidden).squeeze(-1).float() * response_mask.to(torch.float32)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row, for left and right padding alike. Shape: (B, T) -> (B,)."""
    t = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (t * attention_mask.long()).argmax(-1)


def sequence_scores(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar score of each sequence, read at its last real token (never on padding). Shape: (B, T) -> (B,) float32."""
    hidden = backbone_hidden(model, input_ids, attention_mask)  # (B, T, H)
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_token_index(attention_mask)]  # (B, H)
    return model.score(last).squeeze(-1).float()

