"""The conversations behind the rendered prompts, so that a reward model with a tokenizer of its own
(`reward.name_or_path`) reads each prompt through its own chat template, not the policy's (docs/data.md).

The data stage renders every prompt once, with the policy's template (`Renderer`), and writes the conversation of
each rendered text to `conversations.jsonl` ({"prompt": text, "messages": [...]}). Where the reward model's tokenizer
differs from the policy's, `RewardRendering` maps a policy-rendered prompt back to its messages and renders them with
the RM's template (`data.render` decides as for the policy: its template when it has one, else an HH transcript).
The reward stage trains on that rendering, and PPO and eval score with it, so the RM sees one format throughout.
A prompt with no recorded conversation (the built-in tasks, a prompt cut to fit the context) keeps the policy's
text; `misses` counts them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .chat import Messages, Renderer, check_messages
from .fields import DataError
from .jsonl import jsonl_rows, write_jsonl
from .records import PairExample, RankedExample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FILE_NAME = "conversations.jsonl"


def write_conversations(path: str | Path, table: Mapping[str, Messages]) -> Path:
    """One row per rendered prompt, sorted by text (the file's bytes depend on the data only)."""
    return write_jsonl(path, ({"prompt": text, "messages": table[text]} for text in sorted(table)))


def read_conversations(path: str | Path) -> dict[str, Messages]:
    """The table written by `write_conversations`; {} when the file is absent (data from before it, or a built-in
    task). A bad row raises a `DataError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return {}
    table: dict[str, Messages] = {}
    for lineno, obj in jsonl_rows(path):
        try:
            if isinstance(obj, DataError):
                raise obj
            if not isinstance(obj.get("prompt"), str):
                raise DataError("field 'prompt': expected a string", field="prompt", kind="wrong type")
            table[obj["prompt"]] = check_messages(obj.get("messages"), "messages")
        except DataError as e:
            raise DataError(f"{path}:{lineno}: {e}", path=str(path), line=lineno, kind=e.kind or "bad row") from None
    return table


class RewardRendering:
    """Policy-rendered prompt text -> the same conversation rendered for the reward model.

    `policy_tokenizer` (optional) also keys each prompt by its round trip through the policy's tokens, the text
    PPO decodes from a rollout's prompt ids."""

    def __init__(self, table: Mapping[str, Messages], reward_tokenizer: PreTrainedTokenizerBase, mode: str = "auto",
                 policy_tokenizer: PreTrainedTokenizerBase | None = None):
        self.renderer = Renderer(lambda: reward_tokenizer, mode)
        self.table = dict(table)
        if policy_tokenizer is not None:
            for text, messages in table.items():
                ids = policy_tokenizer(text, add_special_tokens=False)["input_ids"]
                self.table.setdefault(policy_tokenizer.decode(ids, skip_special_tokens=False), messages)
        self.templated = self.renderer.templated()
        self.misses = 0
        self._done: dict[str, str] = {}

    @property
    def rendered(self) -> int:
        """Distinct prompts rendered so far."""
        return len(self._done)

    def prompt(self, text: str) -> str:
        """The RM's rendering of a policy prompt; the text as it is when its conversation is unknown."""
        if text not in self._done:
            messages = self.table.get(text)
            if messages is None:
                self.misses += 1
                return text
            self._done[text] = self.renderer.prompt(messages, "prompt")
        return self._done[text]

    def response(self, text: str) -> str:
        """A reply as it follows the RM's prompt: the content after a template (a policy's HH reply loses its leading
        space), after a space in an HH transcript."""
        return text.lstrip() if self.templated else self.renderer.response(text)


def reward_rendering(table: Mapping[str, Messages], same_tokenizer: bool, reward_tokenizer: PreTrainedTokenizerBase,
                     mode: str = "auto", policy_tokenizer: PreTrainedTokenizerBase | None = None
                     ) -> RewardRendering | None:
    """The RM's own rendering, or None where it reads the policy's text: the same tokenizer, or no conversations
    recorded."""
    if same_tokenizer or not table:
        return None
    return RewardRendering(table, reward_tokenizer, mode, policy_tokenizer)


def rendered_ranked(examples: Sequence[RankedExample], rendering: RewardRendering | None) -> list[RankedExample]:
    """Ranked lists as the RM reads them: each prompt and reply through `rendering` (as they are without one)."""
    if rendering is None:
        return list(examples)
    return [replace(e, prompt=rendering.prompt(e.prompt), responses=tuple(rendering.response(r) for r in e.responses))
            for e in examples]


def rendered_pairs(pairs: Sequence[PairExample], rendering: RewardRendering | None) -> list[PairExample]:
    """Held-out pairs as the RM reads them (`rendered_ranked`)."""
    if rendering is None:
        return list(pairs)
    return [replace(p, prompt=rendering.prompt(p.prompt), chosen=rendering.response(p.chosen),
                    rejected=rendering.response(p.rejected)) for p in pairs]
