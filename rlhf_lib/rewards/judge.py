"""A judge: a causal language model that grades each reply, its score read from its next-token probabilities
(never from generated text, which a policy could game by steering the judge's wording).

The rubric (`template`, with {prompt} and {response}) is the user's message of a one-turn chat, rendered with the
judge's chat template and a generation prompt (plain text when the tokenizer has no template). At the position that
would generate the judge's first answer token:

    yes_probability   s = P(yes) / (P(yes) + P(no)),  P(yes) summed over the tokens that begin "Yes", " Yes",
                      "yes", " yes", "YES" and no No answer (the same for No): in [0, 1]
    rating            s = sum_k k * P(k) / sum_k P(k) over the tokens "1" .. "rating_max": in [1, rating_max]

Renormalising over the answer tokens makes the score independent of the mass the judge puts elsewhere (a leading
space, "Sure"). The judge is frozen, in eval mode, on the device and dtype it was given, `batch_size` rubrics per
forward pass, left-padded so that every row's answer position is the last column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from rlhf_lib.devices import module_device
from rlhf_lib.rewards.base import RewardError, TextBatch

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from pathlib import Path

    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rlhf_lib.config.rewards import RewardSource

YES, NO = ("Yes", " Yes", "yes", " yes", "YES"), ("No", " No", "no", " no", "NO")


def answer_tokens(tokenizer: PreTrainedTokenizerBase, words: Sequence[str]) -> list[int]:
    """The distinct first tokens of `words` (how each would begin the judge's answer)."""
    ids = {tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in words
           if tokenizer(w, add_special_tokens=False)["input_ids"]}
    return sorted(ids)


def yes_no_tokens(tokenizer: PreTrainedTokenizerBase, source: str) -> tuple[list[int], list[int]]:
    """The first tokens of the Yes answers and of the No answers, without those that begin both (a tokenizer
    without a " Yes" token starts " Yes" and " No" alike with a space); refused, naming the source, when either side
    is left empty."""
    yes, no = set(answer_tokens(tokenizer, YES)), set(answer_tokens(tokenizer, NO))
    yes, no = sorted(yes - no), sorted(no - yes)
    if not yes or not no:
        raise RewardError(f"{source}: the judge's tokenizer cannot tell a Yes token from a No token")
    return yes, no


def rating_tokens(tokenizer: PreTrainedTokenizerBase, rating_max: int, source: str) -> list[int]:
    """The token of each rating 1..rating_max; a rating that is not one token is refused, naming the source."""
    out = []
    for k in range(1, rating_max + 1):
        ids = tokenizer(str(k), add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise RewardError(f"{source}: the rating {k} is {len(ids)} tokens for the judge's tokenizer; a rating "
                              "must be one token (lower rating_max, or use score: yes_probability)")
        out.append(ids[0])
    return out


def render_rubric(tokenizer: PreTrainedTokenizerBase, template: str, prompt: str, response: str) -> str:
    """The judge's input text: the rubric as the user's message, with a generation prompt."""
    text = template.replace("{prompt}", prompt).replace("{response}", response)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


class JudgeReward:
    """A `TextReward` (batch -> one float per row) grading with a frozen causal LM."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, template: str,
                 score: str = "yes_probability", rating_max: int = 5, max_length: int = 1024, batch_size: int = 8,
                 source: str = "judge"):
        if "{prompt}" not in template or "{response}" not in template:
            raise RewardError(f"{source}: the template needs the placeholders {{prompt}} and {{response}}")
        from rlhf_lib.models import fit_length

        self.model, self.tokenizer, self.template = model.eval(), tokenizer, template
        # At most what the judge's position embeddings cover.
        self.score, self.max_length = score, fit_length(max_length, model)
        self.batch_size, self.source = batch_size, source
        for p in self.model.parameters():
            p.requires_grad_(False)
        if score == "yes_probability":
            self.yes, self.no = yes_no_tokens(tokenizer, source)
        elif score == "rating":
            self.ratings = rating_tokens(tokenizer, rating_max, source)
        else:
            raise RewardError(f"{source}: unknown score {score!r}; expected yes_probability or rating")

    def encode(self, prompts: Sequence[str], completions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded rubric ids (B, T) and mask; a rubric longer than max_length keeps its last tokens (the reply
        and the question come last)."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        rows = [self.tokenizer(render_rubric(self.tokenizer, self.template, p, c),
                               add_special_tokens=False)["input_ids"][-self.max_length:]
                for p, c in zip(prompts, completions)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
        return ids, mask

    @torch.inference_mode()
    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> torch.Tensor:
        """One score per (prompt, completion). Shape: (B,) float32 on the CPU."""
        out = []
        device = module_device(self.model)
        for i in range(0, len(prompts), self.batch_size):
            ids, mask = (t.to(device) for t in self.encode(prompts[i : i + self.batch_size],
                                                           completions[i : i + self.batch_size]))
            pos = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding must not shift positions
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
            probs = torch.softmax(logits, -1)  # (B, V)
            if self.score == "yes_probability":
                yes, no = probs[:, self.yes].sum(-1), probs[:, self.no].sum(-1)
                out.append((yes / (yes + no).clamp(min=1e-30)).cpu())
            else:
                p = probs[:, self.ratings]  # (B, K)
                k = torch.arange(1, len(self.ratings) + 1, device=p.device, dtype=p.dtype)
                out.append(((p * k).sum(-1) / p.sum(-1).clamp(min=1e-30)).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def __call__(self, batch: TextBatch) -> list[float]:
        return self.scores(batch.prompts, batch.completions).tolist()


def load_judge(source: RewardSource, path: str | Path, dtype: torch.dtype = torch.float32) -> JudgeReward:
    """The judge of a `kind: judge` source from its local folder (or hub id), its weights in `dtype`, on the CPU
    (the trainer places it); a model that cannot be loaded is refused naming the source."""
    from rlhf_lib.model_dirs import load_causal_lm

    try:
        model, tokenizer = load_causal_lm(path, dtype=dtype)
    except Exception as e:  # noqa: BLE001 - any loader failure names the source
        raise RewardError(f"{source.describe()}: cannot load the judge from {path}: {type(e).__name__}: {e}") from e
    return JudgeReward(model, tokenizer, source.template, source.score, source.rating_max, source.max_length,
                       source.batch_size or 8, source.describe())


def check_judge(source: RewardSource, path: str | Path) -> None:
    """The preflight of a `kind: judge` source, before any stage work: its tokenizer loads and has the answer tokens
    its score reads (Yes/No apart, or each rating one token). Raises `RewardError` naming the source."""
    from rlhf_lib.models import load_tokenizer

    try:
        tokenizer = load_tokenizer(path)
    except Exception as e:  # noqa: BLE001 - any loader failure names the source
        raise RewardError(f"{source.describe()}: cannot load the judge's tokenizer from {path}: "
                          f"{type(e).__name__}: {e}") from e
    if source.score == "rating":
        rating_tokens(tokenizer, source.rating_max, source.describe())
    else:
        yes_no_tokens(tokenizer, source.describe())
