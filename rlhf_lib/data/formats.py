"""User data formats: which one a source is in, and how each of its rows becomes one of the pipeline's records.

Preferences -> `RankedExample` (responses best first; a pair is a list of two):

| format | columns |
| --- | --- |
| `hh` | `chosen`, `rejected`: whole HH transcripts; the prompt is their shared conversation (`hh.py`) |
| `standard` | `prompt`, `chosen`, `rejected`: strings (TRL standard, explicit prompt) |
| `conversational` | `chosen`, `rejected`: message lists; `prompt`: a message list, or absent (the shared messages) |
| `ranked` | `prompt`, `responses`, `ranking` (indices into responses, best first) |
| `scored` | `prompt`, `responses`, `scores` (one number per response, higher is better) |

SFT -> `SFTExample`: `prompt_completion` (`prompt` + `completion` or `response`: strings, or messages and one
assistant message), `messages` (a conversation ending with the assistant's reply, the trained response), `text`
(an HH transcript is split at its last assistant turn; other text is trained on whole, with an empty prompt).
Prompts -> `PromptExample`: `prompt`, a string or a message list.

Detection looks at the columns (after the user's column mapping) and the type of `chosen` of the first row; it
refuses to guess when two formats fit, or when `chosen` repeats `prompt` (an HH transcript beside a prompt column?).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .chat import Renderer, assistant_reply, check_messages, is_messages
from .fields import DataError, Fields, bad
from .hh import HUMAN_TURN, split_pair, split_transcript
from .records import ASSISTANT_TURN, PromptExample, RankedExample, SFTExample, check_no_ties, check_pair, ranked

PREFERENCE_FORMATS = ("hh", "standard", "conversational", "ranked", "scored")
SFT_FORMATS = ("prompt_completion", "messages", "text")
EXPECTED = {
    "preferences": "chosen + rejected (hh, standard with prompt, conversational) or responses + ranking or scores",
    "sft": "prompt + completion (or response), messages, or text",
    "prompts": "prompt",
}


def _preference_candidates(f: Fields) -> list[str]:
    out = []
    if f.has("chosen") and f.has("rejected"):
        if is_messages(f.get("chosen")):
            out.append("conversational")
        else:
            out.append("standard" if f.has("prompt") else "hh")
    out += [fmt for fmt, col in (("ranked", "ranking"), ("scored", "scores")) if f.has("responses") and f.has(col)]
    return out


def _sft_candidates(f: Fields) -> list[str]:
    has_completion = f.has("completion") or f.has("response")
    return [fmt for fmt, ok in (("prompt_completion", f.has("prompt") and has_completion),
                                ("messages", f.has("messages")), ("text", f.has("text"))) if ok]


CANDIDATES: dict[str, Callable[[Fields], list[str]]] = {
    "preferences": _preference_candidates, "sft": _sft_candidates,
    "prompts": lambda f: ["prompt"] if f.has("prompt") else [],
}


def detect(kind: str, row: Mapping[str, Any], mapping: Mapping[str, str] | None = None) -> str:
    """The format of a `kind` source ("preferences", "sft", "prompts") from one of its rows; a `DataError` (kind
    "unknown format") when no format or more than one fits."""
    f = Fields(row, mapping)
    found = CANDIDATES[kind](f)
    hint = f"; set data.{kind}_format or map the columns with data.{kind}_columns"
    if not found:
        raise DataError(f"cannot tell the format from the columns {sorted(row)}: expected {EXPECTED[kind]}{hint}",
                        kind="unknown format")
    if len(found) > 1:
        raise DataError(f"ambiguous format: the columns {sorted(row)} fit {' and '.join(found)}{hint}",
                        kind="unknown format")
    prompt, chosen = row.get(f.col("prompt")), row.get(f.col("chosen"))
    if found == ["standard"] and isinstance(prompt, str) and isinstance(chosen, str) and prompt.strip() \
            and chosen.startswith(prompt):
        raise DataError(f"ambiguous format: {f.col('chosen')!r} repeats {f.col('prompt')!r} (whole transcripts: "
                        f"hh; separate completions: standard){hint}", kind="unknown format")
    return found[0]


def _prompt(f: Fields, r: Renderer) -> tuple[str, bool]:
    """The prompt text, and whether it was a conversation (its responses then follow the renderer's style)."""
    value = f.get("prompt")
    if isinstance(value, list):
        return r.prompt(check_messages(value, f.col("prompt")), f.col("prompt")), True
    if r.templated():  # an HH prompt becomes its turns, any other plain prompt one user message
        text = f.text("prompt")
        if text.startswith(HUMAN_TURN) and text.endswith(ASSISTANT_TURN):
            return r.hh_prompt(text, f.col("prompt")), True
        return r.text_prompt(text), True
    return f.text("prompt"), False


def _conversational(f: Fields, r: Renderer) -> RankedExample:
    cols = (f.col("chosen"), f.col("rejected"))
    if f.has("prompt"):
        prompt, _ = _prompt(f, r)
        chosen, rejected = (assistant_reply(f.get(n), c) for n, c in zip(("chosen", "rejected"), cols))
    else:  # implicit prompt: two conversations that differ in the assistant's last message only
        a, b = (check_messages(f.get(n), c) for n, c in zip(("chosen", "rejected"), cols))
        if len(a) < 2 or a[:-1] != b[:-1]:
            raise bad("no shared prompt", f"fields {cols[0]!r} and {cols[1]!r}: not one conversation with two "
                      "different last replies", cols[1])
        for conv, col in zip((a, b), cols):
            if conv[-1]["role"] != "assistant":
                raise bad("not an assistant reply", f"field {col!r}: the last message is not the assistant's", col)
        prompt, chosen, rejected = r.prompt(a[:-1], cols[0]), a[-1]["content"], b[-1]["content"]
    check_pair(chosen, rejected, cols)
    return RankedExample(prompt, (r.response(chosen), r.response(rejected)))


def parse_preference(fmt: str, f: Fields, r: Renderer) -> RankedExample:
    """One preference row of format `fmt` as a ranked list, best first."""
    if fmt == "hh":
        prompt, a, b = split_pair(f.text("chosen"), f.text("rejected"), (f.col("chosen"), f.col("rejected")))
        return RankedExample(r.hh_prompt(prompt, f.col("chosen")), (r.reply(a), r.reply(b)))
    if fmt == "conversational":
        return _conversational(f, r)
    prompt, conversational = _prompt(f, r)
    style = r.response if conversational else str
    if fmt == "standard":
        chosen, rejected = f.text("chosen"), f.text("rejected")
        check_pair(chosen, rejected, (f.col("chosen"), f.col("rejected")))
        return RankedExample(prompt, (style(chosen), style(rejected)))
    responses = f.texts("responses")
    check_no_ties(responses, f.col("responses"))
    if fmt == "ranked":
        return RankedExample(prompt, tuple(map(style, ranked(f, responses))))
    scores = f.numbers("scores", len(responses))
    if len(set(scores)) < len(scores):
        raise bad("tied scores", f"field {f.col('scores')!r}: tied scores {scores} (a tie cannot be ranked)",
                  f.col("scores"))
    order = sorted(range(len(responses)), key=lambda i: -scores[i])
    return RankedExample(prompt, tuple(style(responses[i]) for i in order))


def parse_sft(fmt: str, f: Fields, r: Renderer) -> SFTExample:
    """One SFT row of format `fmt` as (prompt, response)."""
    if fmt == "text":
        text = f.text("text")
        if ASSISTANT_TURN not in text:
            return SFTExample("", text)
        prompt, response = split_transcript(text, f.col("text"))
        return SFTExample(r.hh_prompt(prompt, f.col("text")), r.reply(response))
    if fmt == "messages":
        col = f.col("messages")
        conv = check_messages(f.get("messages"), col)
        if conv[-1]["role"] != "assistant" or len(conv) < 2:
            raise bad("no assistant turn", f"field {col!r}: expected a conversation ending with the assistant's "
                      "reply (the response trained on)", col)
        return SFTExample(r.prompt(conv[:-1], col), r.response(conv[-1]["content"]))
    name = "response" if f.has("response") and not f.has("completion") else "completion"
    prompt, conversational = _prompt(f, r)
    value = f.get(name)
    if isinstance(value, list):
        return SFTExample(prompt, r.response(assistant_reply(value, f.col(name))))
    return SFTExample(prompt, r.response(f.text(name)) if conversational else f.text(name))


def parse_prompt(fmt: str, f: Fields, r: Renderer) -> PromptExample:
    """One prompt row (a string, or messages rendered up to the assistant's turn)."""
    return PromptExample(_prompt(f, r)[0])


PARSERS = {"preferences": parse_preference, "sft": parse_sft, "prompts": parse_prompt}
