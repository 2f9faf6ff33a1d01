"""Conversational rows: lists of {"role", "content"} messages (TRL's conversational formats), checked, and rendered
to the text the model sees: with the tokenizer's chat template when it has one, else as an HH transcript
("\\n\\nHuman: ...\\n\\nAssistant:"), the format the demo task and a fresh tokenizer use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .fields import DataError, bad, check_text, jtype
from .records import ASSISTANT_TURN

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Messages = list[dict[str, str]]
HH_ROLES = {"user": "Human", "assistant": "Assistant", "system": "System"}


def is_messages(value: Any) -> bool:
    """Whether a field holds a conversation (a list of objects) rather than text."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def check_messages(value: Any, col: str) -> Messages:
    """A non-empty list of {"role": str, "content": non-empty str} (other keys dropped), or a bad row."""
    expected = "expected a list of messages ({role, content})"
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else jtype(value)
        raise bad("wrong type", f"field {col!r}: {expected}, got {got}", col)
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise bad("wrong type", f"field {col!r}: {expected}, item {i} is {jtype(m)}", col)
        for key in ("role", "content"):
            if key not in m:
                raise bad("missing field", f"field {col!r} message {i}: missing {key!r}", col)
            if not isinstance(m[key], str):
                raise bad("wrong type", f"field {col!r} message {i}: {key!r} is {jtype(m[key])}, not a string", col)
        check_text(m["content"], col, f"field {col!r} message {i} content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def assistant_reply(value: Any, col: str) -> str:
    """The content of a one-message assistant completion (TRL conversational `chosen`/`completion`)."""
    messages = check_messages(value, col)
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        roles = [m["role"] for m in messages]
        raise bad("not an assistant reply", f"field {col!r}: expected one assistant message, got roles {roles}", col)
    return messages[0]["content"]


class Renderer:
    """Messages -> prompt text, assistant content -> response text (`data.render`).

    `load_tokenizer` is called once, at the first row that needs it (plain-text data under `mode="text"` never
    pays for it). Under `auto` (a template when the policy's tokenizer has one) and `chat_template` (required),
    prompts go through `apply_chat_template(..., add_generation_prompt=True)` and responses are the content as is:
    HH transcripts and plain string prompts become messages first (`templated`). Otherwise prompts become HH
    transcripts ending in "\\n\\nAssistant:" and responses get the leading space that follows "Assistant:". `used`
    says which happened ("chat_template", "hh" or None when no row was rendered).
    """

    def __init__(self, load_tokenizer: Callable[[], PreTrainedTokenizerBase | None] | None = None,
                 mode: str = "auto") -> None:
        if mode not in ("auto", "chat_template", "text"):
            raise ValueError(f"render mode {mode!r}: expected auto, chat_template or text")
        self._load = load_tokenizer
        self._mode = mode
        self._loaded = False
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self.used: str | None = None
        # Every rendered prompt's conversation, by its text: a reward model with a tokenizer of its own renders the
        # same conversation its own way (rlhf_lib.data.conversations).
        self.conversations: dict[str, Messages] = {}

    def _template(self) -> PreTrainedTokenizerBase | None:
        if not self._loaded:
            tok = self._load() if self._load and self._mode != "text" else None
            self._tokenizer = tok if tok is not None and getattr(tok, "chat_template", None) else None
            self._loaded = True
        if self._mode == "chat_template" and self._tokenizer is None:
            raise DataError("data.render=chat_template: the policy's tokenizer has no chat template (or there is "
                            "no model.name_or_path); set data.render=auto or text", kind="chat template")
        return self._tokenizer

    def _rendered(self) -> PreTrainedTokenizerBase | None:
        """The template tokenizer, for a row that is rendered here: `used` says how."""
        tok = self._template()
        self.used = "chat_template" if tok is not None else "hh"
        return tok

    def templated(self) -> bool:
        """Whether text rows (HH transcripts, string prompts) become messages rendered with the chat template."""
        return self._mode != "text" and self._template() is not None

    def prompt(self, messages: Messages, col: str) -> str:
        """The text of a conversation up to the assistant's next turn."""
        if messages[-1]["role"] == "assistant":
            raise bad("prompt ends with assistant", f"field {col!r}: the prompt's last message is the assistant's; "
                      "nothing is left for the model to answer", col)
        tok = self._rendered()
        if tok is None:
            turns = "".join(f"\n\n{HH_ROLES.get(m['role'], m['role'].title())}: {m['content']}" for m in messages)
            text = turns + ASSISTANT_TURN
        else:
            try:
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            except Exception as e:  # jinja2 raises TemplateError subclasses, templates also raise their own errors
                raise bad("chat template", f"field {col!r}: the chat template refused it ({e})"[:300], col) from None
        self.conversations.setdefault(text, messages)
        return text

    def hh_prompt(self, text: str, col: str) -> str:
        """An HH prompt ("\\n\\nHuman: ...\\n\\nAssistant:") as the model sees it: through the chat template when
        `templated`, else as it is."""
        from .hh import transcript_messages

        if not self.templated():
            try:  # kept as it is; its turns are recorded when they parse, for an RM with a template of its own
                self.conversations.setdefault(text, transcript_messages(text, col))
            except DataError:
                pass
            return text
        return self.prompt(transcript_messages(text, col), col)

    def text_prompt(self, text: str) -> str:
        """A plain string prompt: one user message through the chat template when `templated`, else as it is."""
        if self.templated():
            return self.prompt([{"role": "user", "content": text}], "prompt")
        self.conversations.setdefault(text, [{"role": "user", "content": text}])
        return text

    def reply(self, text: str) -> str:
        """An HH reply (" Hello!") as the response after a rendered prompt: without the space that follows
        "Assistant:" under a template."""
        return text.strip() if self.templated() else text

    def response(self, content: str) -> str:
        """The text of an assistant reply that follows a rendered prompt."""
        if self._rendered() is not None or content[:1].isspace():
            return content
        return " " + content
