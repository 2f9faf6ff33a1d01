"""A trained reward model as a text reward source: what `rlhf serve-reward` runs behind `POST /score`.

Each row is encoded exactly as the RM saw its training rows (`collate.encode_prompt_response`: prompt and completion
tokenized apart, prompt cut from the left, completion from the right) with the RM's EOS appended only to a finished
completion, as PPO's in-process scoring does (`rlhf_lib.rewards.retokenize`). So a served RM gives the scores PPO's
in-process RM gives on the same rows, up to float rounding, whenever re-encoding the decoded completion gives back
the sampled ids (always for ids the tokenizer itself produced; a policy can sample a non-canonical split of a word,
which the text alone cannot show).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlhf_lib.data.collate import encode_prompt_response, pad_right
from rlhf_lib.devices import module_device
from rlhf_lib.lm.scoring import sequence_scores
from rlhf_lib.rewards.base import RewardError, TextBatch, check_scores

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_CONTEXT = 2048
# Characters of a text kept per token of max_length before tokenizing (prompt: its end, completion: its start, as the
# token cut keeps): no tokenizer of the supported families has a token this long, so the cut never changes a row
# that fits, and a 10 MB row costs a few ms instead of seconds under the scoring lock.
CHARS_PER_TOKEN = 32


class TextRewardModel:
    """A `TextReward` over a `*ForSequenceClassification` model with a scalar `.score` head and its tokenizer.

    `max_length`: tokens per row (default and cap: the model's position embeddings); longer rows are cut as in
    training, never refused. `batch_size`: rows per forward pass.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_length: int | None = None,
                 batch_size: int = 32, name: str = "reward model"):
        if batch_size < 1:
            raise ValueError(f"{name}: batch_size must be >= 1, got {batch_size}")
        limit = getattr(model.config, "max_position_embeddings", None) or max_length or DEFAULT_CONTEXT
        self.model, self.tokenizer, self.batch_size, self.name = model.eval(), tokenizer, batch_size, name
        self.max_length = min(max_length or limit, limit)

    def encode(self, batch: TextBatch) -> list[list[int]]:
        """Token ids of each row: prompt + completion (+ EOS when finished), cut to `max_length`. A row without
        any token (empty texts, unfinished) has no last token to read a score at: a `RewardError` naming it."""
        bound = CHARS_PER_TOKEN * self.max_length  # a 10 MB row is not tokenized whole to keep max_length tokens
        rows = [encode_prompt_response(self.tokenizer, p[-bound:], c[:bound], self.max_length, add_eos=done)[0]
                for p, c, done in zip(batch.prompts, batch.completions, batch.finished)]
        if empty := [i for i, r in enumerate(rows) if not r]:
            raise RewardError(f"{self.name}: row {empty[0]}: prompt and completion are both empty and the row is "
                              "not finished: no token to score")
        return rows

    @torch.inference_mode()
    def __call__(self, batch: TextBatch) -> list[float]:
        """One float per row, read at the row's last real token (its EOS when finished)."""
        rows = self.encode(batch)
        device = module_device(self.model)
        out: list[float] = []
        for i in range(0, len(rows), self.batch_size):
            ids, mask = pad_right(rows[i : i + self.batch_size], self.tokenizer.pad_token_id)  # (b, T), (b, T)
            out += sequence_scores(self.model, ids.to(device), mask.to(device)).cpu().tolist()
        return check_scores(out, len(batch), self.name)
