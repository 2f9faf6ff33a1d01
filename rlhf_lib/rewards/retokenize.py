"""Scoring with a reward model that has its own tokenizer (`reward.name_or_path`).

The policy's token ids mean nothing to such an RM, so each (prompt, response) is decoded to text with the policy's
tokenizer and encoded again with the RM's, exactly as the RM saw it in training (`collate.encode_prompt_response`:
prompt cut from the left, response from the right, EOS appended). TRL's PPO trainer refuses this case; its online
DPO and RLOO trainers decode and re-tokenize the same way. The EOS is appended only to responses that ended with the
policy's EOS, so a response cut off at max_new_tokens is scored as unfinished, as with a shared tokenizer. With a
`RewardRendering` (`rlhf_lib.data.conversations`), each prompt is the conversation rendered with the RM's own chat
template, as the reward stage trained it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlhf_lib.data.collate import encode_prompt_response, pad_right
from rlhf_lib.devices import module_device
from rlhf_lib.lm.generation import decode_responses, ends_with_eos
from rlhf_lib.lm.scoring import concat, sequence_scores

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.data.conversations import RewardRendering


def decode_prompts(tokenizer: PreTrainedTokenizerBase, query: torch.Tensor, query_mask: torch.Tensor) -> list[str]:
    """Text of each left-padded prompt. Special tokens are kept (a chat template's markers are part of the prompt
    the RM was trained on); padding is dropped by the mask. Shapes: (B, P), (B, P) -> B strings."""
    return [tokenizer.decode([t for t, keep in zip(ids, m) if keep], skip_special_tokens=False)
            for ids, m in zip(query.tolist(), query_mask.tolist())]


@torch.inference_mode()
def retokenized_scores(
    reward: PreTrainedModel,
    reward_tokenizer: PreTrainedTokenizerBase,
    tokenizer: PreTrainedTokenizerBase,
    query: torch.Tensor,
    query_mask: torch.Tensor,
    response: torch.Tensor,
    response_mask: torch.Tensor,
    max_length: int | None = None,
    rendering: RewardRendering | None = None,
) -> torch.Tensor:
    """RM scores of policy samples through the RM's own tokenizer. Shapes: (B, P), (B, P), (B, R), (B, R) -> (B,).

    `tokenizer` is the policy's; `max_length` (default: the RM's context) bounds the re-tokenized sequence;
    `rendering` renders each prompt's conversation with the RM's template (None: the policy's text as it is).
    """
    limit = getattr(reward.config, "max_position_embeddings", None) or max_length or 2048
    max_length = min(max_length or limit, limit)
    prompts = decode_prompts(tokenizer, query, query_mask)
    texts = decode_responses(tokenizer, response, response_mask)
    if rendering is not None:
        prompts, texts = [rendering.prompt(p) for p in prompts], [rendering.response(t) for t in texts]
    finished = ends_with_eos(response, response_mask, tokenizer.eos_token_id).tolist()
    rows = [encode_prompt_response(reward_tokenizer, p, r, max_length, add_eos=eos)[0]
            for p, r, eos in zip(prompts, texts, finished)]
    ids, mask = pad_right(rows, reward_tokenizer.pad_token_id)
    device = module_device(reward)
    return sequence_scores(reward, ids.to(device), mask.to(device))


class RewardScorer:
    """The frozen reward model as PPO reads it: the raw score of each (prompt, response) row at its last real token.
    With `own_tokenizer` (an RM with a tokenizer of its own) it reads the decoded text through that tokenizer,
    each prompt rendered by `rendering` when given; `tokenizer` is the policy's."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 own_tokenizer: PreTrainedTokenizerBase | None = None, rendering: RewardRendering | None = None):
        self.model, self.tokenizer, self.own_tokenizer, self.rendering = model, tokenizer, own_tokenizer, rendering

    def __call__(self, query: torch.Tensor, query_mask: torch.Tensor, response: torch.Tensor,
                 response_mask: torch.Tensor) -> torch.Tensor:
        """Shapes: (B, P), (B, P), (B, R), (B, R) -> (B,)."""
        if self.own_tokenizer is None:
            return sequence_scores(self.model, *concat(query, query_mask, response, response_mask))
        return retokenized_scores(self.model, self.own_tokenizer, self.tokenizer, query, query_mask, response,
                                  response_mask, rendering=self.rendering)
