"""Reward functions named `package.module:function` in the config: import, call, check, and the digest of their
source for the PPO cache key."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any

from rlhf_lib.rewards.base import RewardError, TextBatch, check_scores


def import_function(spec: str, source: str) -> Callable[..., Any]:
    """The callable `spec` (`package.module:function`); a `RewardError` naming `source` when it cannot be imported
    or is not callable."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module's own code failing at import
        raise RewardError(f"{source}: cannot import module {module_name!r}: {type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise RewardError(f"{source}: module {module_name!r} ({module.__file__}) has no attribute {attr!r}")
    if not callable(fn):
        raise RewardError(f"{source}: {spec} is a {type(fn).__name__}, not a function")
    return fn


def function_digest(spec: str, source: str) -> str:
    """SHA-256 of the source file of the function's module: a change to the function (or its helpers in that file)
    changes the PPO cache key. A function without a readable source file is hashed by its qualified name."""
    fn = import_function(spec, source)
    try:
        text = inspect.getsource(inspect.getmodule(fn))
    except (OSError, TypeError):
        text = f"{fn.__module__}.{fn.__qualname__}"
    return hashlib.sha256(text.encode()).hexdigest()


def reward_code(sources: Iterable[Any]) -> dict[str, str]:
    """The source digest of each reward function among `sources` (`ppo.rewards`), by source name: part of the PPO
    and eval cache keys, so an edited function reruns them (an endpoint is identified by its URL and `version`, in
    the config). A function that cannot be imported fails here, naming its source, before anything runs."""
    return {s.name: function_digest(s.function, s.describe()) for s in sources if s.kind == "function"}


class FunctionReward:
    """A `TextReward` calling fn(prompts, completions, finished=..., **columns, **params), at most `timeout_s`
    seconds a batch."""

    def __init__(self, spec: str, params: dict[str, Any], source: str, timeout_s: float = 30.0):
        self.fn, self.params, self.source = import_function(spec, source), dict(params), source
        self.timeout_s = timeout_s

    def __call__(self, batch: TextBatch) -> list[float]:
        try:
            values = call_with_limit(self.timeout_s, self.fn, batch.prompts, batch.completions,
                                     finished=batch.finished, **batch.columns, **self.params)
        except TimeoutError:
            raise RewardError(f"{self.source}: the function took over {self.timeout_s:g} s on a batch of "
                              f"{len(batch)} (timeout_s)") from None
        except RewardError:
            raise
        except Exception as e:
            raise RewardError(f"{self.source}: the function raised {type(e).__name__}: {e}") from e
        return check_scores(values, len(batch), self.source)


def call_with_limit(limit_s: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a daemon thread, waited for at most `limit_s` seconds: its value, its exception, or
    TimeoutError. A call past its limit is abandoned, not killed (Python cannot stop a thread): the caller fails with
    one line and the stuck thread dies with the process. Code that holds the GIL in C (the `re` module) cannot be
    waited out this way; bounded built-ins (`required_format`'s `regex` timeout) bound themselves."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="reward-function", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise TimeoutError(f"over {limit_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
