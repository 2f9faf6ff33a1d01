"""One redaction for everything that leaves the process: MLflow params, tags and the config artifact, Prefect's flow
parameters (every JSON dump of a config), log records, and the one-line errors of the commands.

Secrets are recognised by the key that holds them (`hub_token`, `aws_secret_access_key`, `password`; not
`max_new_tokens` or `tokenizer`) and by their shape in any text: Hugging Face (`hf_...`) and OpenAI-style (`sk-...`)
tokens, `Bearer ...`, the `user:password@` of a URL, and the value of a secret-looking query key of a URL
(`?api_key=...`, `token`, `key`, `password`, `secret`, `sig`, `signature`, `access_token`, `auth`). Each becomes
`***`. Put a secret in the environment instead (`token_env` of an http reward, `${VAR}` in its url): a redacted copy
cannot be used by another process.
"""

from __future__ import annotations

import logging
import re
from typing import Any

MASK = "***"
# A key whose last part names a secret (`hub_token`, `aws_secret_access_key`), not one that merely mentions tokens.
_SECRET_KEY = re.compile(r"(^|[._-])(\w*_)?(token|secret|password|passwd|api[_-]?key|credentials?)(_\w*)?$", re.I)
_QUERY_KEYS = r"api[_-]?key|apikey|access[_-]?token|token|key|password|passwd|pwd|secret|client[_-]?secret|sig|" \
              r"signature|auth|x-amz-signature|x-amz-credential|x-amz-security-token"
_SECRET_VALUE = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}"
    r"|\bsk-[A-Za-z0-9_-]{20,}"
    r"|Bearer\s+(?!\*\*\*)[^\s\"',;]+"
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"
    rf"|(?<=[?&])(?:{_QUERY_KEYS})=(?!\*\*\*|\$\{{)[^&#\s\"']+", re.I)  # `${VAR}`: a reference, kept


def _mask(match: re.Match) -> str:
    text = match.group(0)
    if text[:6].lower() == "bearer":
        return "Bearer " + MASK
    if "=" in text:  # a query pair keeps its key
        return text.split("=", 1)[0] + "=" + MASK
    return MASK


def redact_text(text: str) -> str:
    """`text` with every secret-shaped part replaced by `***`. Example:
    "https://u:pw@judge/score?api_key=abc&n=1" -> "https://***@judge/score?api_key=***&n=1"."""
    return _SECRET_VALUE.sub(_mask, text)


def redact(key: str, value: Any) -> str:
    """A param's or tag's value as text, `***` whole when its key names a secret, else `redact_text`."""
    return MASK if _SECRET_KEY.search(key) else redact_text(str(value))


def redact_tree(value: Any, key: str = "", by_key: bool = True) -> Any:
    """A JSON-like tree with every string through `redact_text`, and (`by_key`) secret keys' values masked whole.
    Configs use by_key=False: they hold no secret by design, and `token_env` names a variable, not a token."""
    if isinstance(value, dict):
        return {k: redact_tree(v, str(k), by_key) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v, key, by_key) for v in value]
    if by_key and key and _SECRET_KEY.search(key) and value is not None:
        return MASK
    return redact_text(value) if isinstance(value, str) else value


class _Redacting:
    """A log record factory wrapper: each record's message is formatted once and redacted (args folded in)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, *args, **kwargs) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logging module's to report
            return record
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return record


def redact_logs() -> None:
    """Redact every log record of this process from now on, whichever handler sends it (console, Prefect's API
    handler, files). Idempotent."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _Redacting):
        logging.setLogRecordFactory(_Redacting(factory))
