"""Errors a user can act on: which exceptions are the user's to fix, and the one message each prints.

Everything else is a bug or a crash and keeps its traceback. The same types are kept off the terminal while Prefect
logs a failed run (`quiet_user_errors`): the stage's run in the UI still records the failure, and the command then
prints its one message.
"""

from __future__ import annotations

import logging

from rlhf_lib.config import ConfigError
from rlhf_lib.data import DataError
from stages.launch import LaunchError
from stages.net import ArtifactNotFound, ServiceUnreachable

USER_ERRORS = (ConfigError, DataError, ArtifactNotFound, ServiceUnreachable, LaunchError, FloatingPointError)


def user_error(e: BaseException) -> str | None:
    """The message to print for an error the user can act on; None for anything else (it keeps its traceback)."""
    if isinstance(e, ConfigError):
        return f"bad config: {e}"
    if isinstance(e, DataError):
        message = f"bad data: {e}"
        if e.bad_rows:
            message += (f"\n  {e.bad_rows} of the {e.rows} rows of {e.path} are bad; to skip them (each reason is "
                        "counted in the data run's metrics), add --set data.on_bad_row=skip")
        return message
    if isinstance(e, LaunchError):
        return f"the training processes failed: {e}"
    if isinstance(e, FloatingPointError):
        return f"training diverged: {e}"
    if isinstance(e, USER_ERRORS):
        return str(e)
    return None


def _is_user_error(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    while exc is not None:
        if isinstance(exc, USER_ERRORS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class QuietUserErrors(logging.Filter):
    """Drops log records that carry a user error's traceback (Prefect's "Encountered exception during execution"
    of each failing flow and task run) from a console handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_user_error(record)


def quiet_user_errors() -> None:
    """Attach `QuietUserErrors` to the console handlers of the root logger (where Prefect's console handler sits)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not any(isinstance(f, QuietUserErrors)
                                                                   for f in handler.filters):
            handler.addFilter(QuietUserErrors())
