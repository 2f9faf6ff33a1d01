"""How an environment's observation enters the token stream after the policy's turn (its EOS included), in the
format the prompts are in:

- HH transcripts (the built-in tasks, a tokenizer without a chat template): `"\\n\\nTool: 85\\n\\nAssistant:"`;
- a chat template (e.g. SmolLM2's ChatML): what the template writes after an assistant message that ends the
  turn: the rest of the turn's end (ChatML's newline after `<|im_end|>`), the observation as a `tool` message (a
  `user` message where the template refuses the tool role), and the next assistant header.

The data builders write multi-turn demonstrations with `transcript_observation`, so SFT and rollouts agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_MARK = "\x00OBSERVATION\x00"
_REPLY = "\x00REPLY\x00"


def transcript_observation(observation: str) -> str:
    """The text after the policy's EOS in an HH transcript."""
    return f"\n\nTool: {observation}\n\nAssistant:"


def is_transcript(prompts: Sequence[str]) -> bool:
    """Whether the prompts are HH transcripts (each ends with "Assistant:")."""
    return bool(prompts) and all(p.rstrip().endswith("Assistant:") for p in prompts)


class ObservationFormat:
    """`text(observation)`: the text that follows a policy turn; `ids(observation)`: its tokens."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, transcript: bool):
        self.tokenizer = tokenizer
        self.template = transcript_observation(_MARK) if transcript else self._chat_template()

    def _chat_template(self) -> str:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            raise ValueError("ppo.environment: the prompts are not HH transcripts and the tokenizer has no chat "
                             "template: there is no format to put the environment's observations in")
        base = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _REPLY}]
        before = tok.apply_chat_template(base, tokenize=False)
        # What the template writes after the assistant's words: its turn end. The policy's own EOS is in the stream
        # already (the last token it sampled); the rest of the turn end is not.
        tail = before[before.index(_REPLY) + len(_REPLY):] if _REPLY in before else ""
        eos = tok.eos_token or ""
        if eos and eos in tail:
            tail = tail[tail.index(eos) + len(eos):]
        for role in ("tool", "user"):
            try:
                after = tok.apply_chat_template(base + [{"role": role, "content": _MARK}], tokenize=False,
                                                add_generation_prompt=True)
            except Exception:  # a template that raises on an unknown role
                continue
            if after.startswith(before) and _MARK in after:
                return tail + after[len(before):]
        raise ValueError("ppo.environment: the tokenizer's chat template does not render a tool or user message "
                         "after the assistant's as a continuation")

    def text(self, observation: str) -> str:
        return self.template.replace(_MARK, observation)

    def ids(self, observation: str) -> list[int]:
        return self.tokenizer(self.text(observation), add_special_tokens=False)["input_ids"]
