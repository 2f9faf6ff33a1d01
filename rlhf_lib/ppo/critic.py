"""The value function of RLHF-PPO in its three forms, behind one interface the loop uses.

- separate: a scalar-head model of its own (initialised from the reward model or from SFT; InstructGPT and the
  N+ implementation details use the RM), with its own forward and backward in every update.
- shared: a linear value head on the policy's final hidden states, trained through the policy's backbone
  (one forward gives log-probs and values; "The 37 Implementation Details of PPO", shared network, and TRL's
  `AutoModelForCausalLMWithValueHead`).
- none: the critic-free estimators (grpo, rloo) load and train no value function at all.

Notation: B = batch, P = prompt length, R = response length, H = hidden size, V = vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor, nn

from rlhf_lib.lm.entropy import entropy_from_logits
from rlhf_lib.lm.scoring import (
    Entropy,
    chunked_logprobs,
    concat,
    gather_logprobs,
    keep_last,
    no_cache,
    output_head,
    position_ids,
    response_logits,
    response_states,
    token_values,
)

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel

CriticKind = Literal["separate", "shared", "none"]


class TokenValues(nn.Module):
    """A separate value model's V(s_t) as one module call. `token_values` calls the model's backbone and head
    directly, which would bypass a DDP wrapper's forward (and so its gradient synchronisation): under
    `accelerate launch` this module is what gets wrapped. Shapes: as `token_values`."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model

    def forward(self, query: Tensor, query_mask: Tensor, response: Tensor, response_mask: Tensor) -> Tensor:
        return token_values(self.model, query, query_mask, response, response_mask)


class ValueHead(nn.Module):
    """V(s) = w . h + b on a hidden state. Zero-initialised: the critic starts by predicting 0 everywhere, which
    with RM offset normalisation is the expected return of an SFT sample (so the first advantages are not noise
    from a random head). Shape: (..., H) -> (...)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1).float()


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0. With dropout on, the log-probs of the update's forward would not match
    those of the rollout even before any step, so the PPO ratio starts != 1 and the KL is noise (N+ implementation
    details, "disable dropout"; TRL does the same to all four models)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout", "attention_dropout", "dropout"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


@dataclass
class Critic:
    """`module` holds exactly the critic's own trainable parameters (the value model, the head, or nothing):
    it is what the optimizer's critic group trains and what a checkpoint saves. `offset` is subtracted from a
    separate value model's output: a value model copied from the RM starts out predicting raw RM scores, so it
    gets the same offset as the scores (the N+ implementation details normalise the RM's bias before copying it).
    """

    kind: CriticKind
    module: nn.Module
    offset: float = 0.0
    wrapped: nn.Module | None = None  # the DDP-wrapped `trainable_forward()` under accelerate launch, else None

    @classmethod
    def build(cls, kind: CriticKind, policy: PreTrainedModel, value_model: PreTrainedModel | None) -> Critic:
        if kind == "separate":
            if value_model is None:
                raise ValueError("ppo.critic=separate needs a value model")
            return cls(kind, value_model)
        if kind == "shared":
            return cls(kind, ValueHead(policy.config.hidden_size))
        return cls("none", nn.Module())

    @property
    def trains(self) -> bool:
        return self.kind != "none"

    def trainable_forward(self) -> nn.Module | None:
        """The module whose forward computes the critic's trained values: what a DDP wrapper must wrap."""
        return {"separate": TokenValues(self.module), "shared": self.module}.get(self.kind)

    @property
    def _net(self):
        """What computes the trained values: the DDP wrapper under accelerate launch, else the module itself."""
        if self.wrapped is not None:
            return self.wrapped
        return partial(token_values, self.module) if self.kind == "separate" else self.module

    def values(self, policy: PreTrainedModel, query: Tensor, query_mask: Tensor, response: Tensor,
               response_mask: Tensor) -> Tensor | None:
        """V(state before each response token), for the rollout. Shape: (B, R), 0 on padding; None without critic."""
        if self.kind == "separate":
            values = self._net(query, query_mask, response, response_mask)
            return (values - self.offset) * response_mask.to(values.dtype) if self.offset else values
        if self.kind == "shared":
            return _shared_forward(policy, self._net, query, query_mask, response, response_mask, 1.0,
                                   train_backbone=False)[2]
        return None

    def forward(self, policy: PreTrainedModel, query: Tensor, query_mask: Tensor, response: Tensor,
                response_mask: Tensor, temperature: float, train_policy: bool, entropy: Entropy = "grad",
                with_values: bool = True, chunk: int | None = None
                ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The update's forward: (log-probs, entropy, values), each (B, R), float32 and 0 on padding.

        Without `train_policy` (critic warm-up) the policy's log-probs are not computed (None) and a shared
        backbone runs without gradient: only the critic's own parameters learn. `entropy`: "grad" (the entropy
        bonus), "detached" (logged only: no gradient through its softmax) or "none" (not computed: None).
        `with_values=False` leaves a separate value model's forward to the caller (values None). `chunk`: response
        positions projected to the vocabulary at a time (`scoring.chunked_logprobs`); None: all at once.
        """
        if self.kind == "shared":
            return _shared_forward(policy, self._net, query, query_mask, response, response_mask, temperature,
                                   train_backbone=train_policy, entropy=entropy, chunk=chunk)
        logprobs = ent = None
        if train_policy:
            if chunk is None:
                logits = response_logits(policy, query, query_mask, response, response_mask, temperature)
                logprobs, ent = _logprobs_entropy(logits, response, response_mask, entropy)
            else:
                hidden = response_states(policy, query, query_mask, response, response_mask)
                logprobs, ent = chunked_logprobs(output_head(policy), hidden, response, response_mask, temperature,
                                                 chunk, entropy)
        values = self.values(policy, query, query_mask, response, response_mask) if with_values else None
        return logprobs, ent, values


def _shared_forward(policy: PreTrainedModel, head: ValueHead, query: Tensor, query_mask: Tensor, response: Tensor,
                    response_mask: Tensor, temperature: float, train_backbone: bool, entropy: Entropy = "grad",
                    chunk: int | None = None) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """One policy forward for log-probs, entropy and values. Position P-1+t predicts response token t, so its
    final hidden state is the state V(s_t) is read from; only those R positions are projected to the vocabulary
    (`chunk` of them at a time when set)."""
    ids, mask = concat(query, query_mask, response, response_mask)
    p, r = query.shape[1], response.shape[1]
    keep = keep_last(policy, r + 1 if chunk is None and train_backbone else 1)
    with torch.set_grad_enabled(train_backbone and torch.is_grad_enabled()):
        out = policy(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), output_hidden_states=True,
                     **keep, **no_cache(policy))
    m = response_mask.to(torch.float32)
    hidden = out.hidden_states[-1][:, p - 1 : p + r - 1]  # (B, R, H)
    values = head(hidden) * m  # (B, R)
    if not train_backbone:
        return None, None, values
    if chunk is not None:
        return (*chunked_logprobs(output_head(policy), hidden, response, response_mask, temperature, chunk, entropy),
                values)
    logits = out.logits[:, -(r + 1) : -1].float() / temperature  # (B, R, V)
    return (*_logprobs_entropy(logits, response, response_mask, entropy), values)


def _logprobs_entropy(logits: Tensor, response: Tensor, response_mask: Tensor, entropy: Entropy
                      ) -> tuple[Tensor, Tensor | None]:
    """Shapes: logits (B, R, V), response, response_mask (B, R) -> log-probs (B, R), entropy (B, R) or None (with
    entropy="none"); 0 on padding."""
    m = response_mask.to(logits.dtype)
    logprobs = gather_logprobs(logits, response) * m
    if entropy == "none":
        return logprobs, None
    return logprobs, entropy_from_logits(logits if entropy == "grad" else logits.detach()) * m
