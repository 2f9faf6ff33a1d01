"""Resolvers and the span of a build (`stages.inputs`): a function marked `@resolver` turns a reference (a URI, a
model name, a config) into what a build reads, and refuses to run inside a stage's build (`ResolverInBuild`)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_BUILDING: contextvars.ContextVar[str | None] = contextvars.ContextVar("rlhf_building", default=None)
RESOLVERS: list[str] = []  # every function wrapped by `resolver`, by qualified name (a test lists them)


class ResolverInBuild(RuntimeError):
    """A stage's build called a resolver: what it needs must come from its resolved inputs."""


def resolver(fn: F) -> F:
    """Mark `fn` as a resolver: it turns a reference (a URI, a name, a config) into what a build reads, and may only
    run in a stage's resolution step, never inside its build."""
    RESOLVERS.append(f"{fn.__module__}.{fn.__qualname__}")

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if (stage := _BUILDING.get()) is not None:
            raise ResolverInBuild(f"the {stage} stage's build called the resolver {fn.__module__}.{fn.__qualname__}: "
                                  "resolve it in the stage's resolve step (stages.inputs) instead")
        return fn(*args, **kwargs)
    return guarded  # type: ignore[return-value]


@contextlib.contextmanager
def building(stage: str) -> Iterator[None]:
    """The span of a stage's build: resolvers refuse to run inside it."""
    token = _BUILDING.set(stage)
    try:
        yield
    finally:
        _BUILDING.reset(token)
