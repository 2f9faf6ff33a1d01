"""SIGTERM (`kill`, a scheduler's cancel) unwinds `rlhf` like Ctrl-C instead of ending the process on the spot:
`finally` blocks and atexit handlers run, so Prefect's temporary server and launched training processes stop with
it, and the exit code is 128 + 15.

The signal is recorded before its `SystemExit` is raised: the code it interrupts may wrap that exception in an error
of its own (pydantic's serializer does, while Prefect dumps its settings at start-up), and `cli.main` still exits
with the signal's code (`terminated`).
"""

from __future__ import annotations

_RECEIVED: list[int] = []


def exit_on_sigterm(signum: int, frame: object) -> None:
    _RECEIVED.append(128 + signum)
    raise SystemExit(128 + signum)


def terminated() -> int | None:
    """The exit code of a SIGTERM this process received, or None."""
    return _RECEIVED[0] if _RECEIVED else None
