"""Anthropic HH-RLHF transcripts: "\\n\\nHuman: ...\\n\\nAssistant: ..." texts (Bai et al. 2022, "Training a Helpful
and Harmless Assistant with RLHF"). A preference row holds two whole transcripts, `chosen` and `rejected`, that share
the conversation and differ in the final assistant turn.

The prompt is the longest common prefix of the two, cut after the last "\\n\\nAssistant:" it contains; the responses
are what follows (TRL's `extract_prompt` does the same). Cutting at the last "\\n\\nAssistant:" of each text instead
would break the ~0.2 % of HH rows whose response itself contains "\\n\\nAssistant:".
"""

from __future__ import annotations

import os
import re

from .fields import bad, check_text
from .records import ASSISTANT_TURN, check_pair

HUMAN_TURN = "\n\nHuman:"
_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")
_ROLE = {"Human": "user", "Assistant": "assistant"}


def transcript_messages(text: str, col: str = "text") -> list[dict[str, str]]:
    """The messages of an HH transcript ("\\n\\nHuman: hi\\n\\nAssistant: Hello"), for the chat template: Human ->
    user, Assistant -> assistant, each content stripped; a trailing empty "\\n\\nAssistant:" (a prompt) is dropped.

    >>> transcript_messages("\\n\\nHuman: hi\\n\\nAssistant: Hello!\\n\\nHuman: and?\\n\\nAssistant:")
    [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'Hello!'}, {'role': 'user', 'content': 'and?'}]
    """
    parts = _TURN.split(text)
    if parts[0].strip() or len(parts) < 3:
        raise bad("not a transcript", f"field {col!r}: expected an HH transcript starting with '\\n\\nHuman:'", col)
    messages = [{"role": _ROLE[role], "content": body.strip()} for role, body in zip(parts[1::2], parts[2::2])]
    if messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()
    for i, m in enumerate(messages):
        if not m["content"]:
            raise bad("empty turn", f"field {col!r}: turn {i} ({m['role']}) is empty", col)
    if not messages or messages[-1]["role"] != "user":
        raise bad("no assistant turn", f"field {col!r}: the conversation does not end with a human turn to answer",
                  col)
    return messages


def prompt_end(text: str, col: str) -> int:
    """Index just past the last "\\n\\nAssistant:" of `text`, or a bad row naming `col`."""
    i = text.rfind(ASSISTANT_TURN)
    if i < 0:
        raise bad("no assistant turn", f"field {col!r}: no '\\n\\nAssistant:' turn (HH transcript format)", col)
    return i + len(ASSISTANT_TURN)


def reply(text: str, col: str) -> str:
    """The last assistant turn of a transcript, or a bad row: some HH rows end with "Assistant:" and no reply."""
    if not text.strip():
        raise bad("empty reply", f"field {col!r}: the conversation ends with an empty assistant reply "
                  "('\\n\\nAssistant:' with nothing after it)", col)
    return check_text(text, col, f"field {col!r}: the last assistant turn")


def split_transcript(text: str, col: str = "text") -> tuple[str, str]:
    """(prompt, response) of one transcript: the response is the last assistant turn (leading space kept)."""
    end = prompt_end(text, col)
    return text[:end], reply(text[end:], col)


def split_pair(chosen: str, rejected: str, cols: tuple[str, str] = ("chosen", "rejected")) -> tuple[str, str, str]:
    """(prompt, chosen response, rejected response) of an HH preference row.

    >>> split_pair("\\n\\nHuman: hi\\n\\nAssistant: Hello!", "\\n\\nHuman: hi\\n\\nAssistant: Go away.")
    ('\\n\\nHuman: hi\\n\\nAssistant:', ' Hello!', ' Go away.')
    """
    for text, col in zip((chosen, rejected), cols):
        prompt_end(text, col)  # each must be a transcript in its own right
    common = os.path.commonprefix([chosen, rejected])
    if ASSISTANT_TURN not in common:
        raise bad("no shared prompt", f"fields {cols[0]!r} and {cols[1]!r}: no shared conversation up to an "
                  "'\\n\\nAssistant:' turn", cols[1])
    end = prompt_end(common, cols[0])
    a, b = reply(chosen[end:], cols[0]), reply(rejected[end:], cols[1])
    check_pair(a, b, cols)
    return chosen[:end], a, b
