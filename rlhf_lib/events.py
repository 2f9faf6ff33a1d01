"""What a training loop reports, as typed events, and where they go: a `Sink`.

The loops of the library (SFT, reward model, PPO) never log anywhere themselves: they hand events to a sink. In the
stage's process the sink is the MLflow run and Prefect's log (`stages`). In a group of processes under `accelerate
launch` the main process's sink is an `EventWriter` that appends each event to a JSON-lines file, which the stage
reads back with `read_events` and hands to its own sink as the launch goes on: the same events, one protocol.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import IO, Any, Protocol


@dataclass(frozen=True)
class Metrics:
    """Scalar metrics of one step (an optimizer step of SFT/RM, an iteration of PPO)."""

    values: dict[str, float]
    step: int


@dataclass(frozen=True)
class Table:
    """Rows of a table artifact, e.g. sample responses, saved as `path` (relative to the run's artifacts)."""

    rows: list[dict[str, Any]]
    path: str


@dataclass(frozen=True)
class Tags:
    """Tags of the run (the alarms raised, why the loop stopped)."""

    tags: dict[str, str]


@dataclass(frozen=True)
class Notice:
    """A warning the user should see (an alarm, an outage)."""

    message: str


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint directory on local disk (`rlhf_lib.ppo.checkpoint`); the sink may move or delete it."""

    path: str
    iteration: int


@dataclass(frozen=True)
class Resumed:
    """The loop resumed from `checkpoint` (a checkpoint directory's name) at `iteration`; None: no candidate
    loaded, the loop starts from scratch."""

    checkpoint: str | None
    iteration: int


Event = Metrics | Table | Tags | Notice | Checkpoint | Resumed
EVENT_TYPES: dict[str, type] = {t.__name__: t for t in (Metrics, Table, Tags, Notice, Checkpoint, Resumed)}


class Sink(Protocol):
    """Where a loop's events go."""

    def emit(self, event: Event) -> None: ...


class Recorder:
    """A sink that keeps every event (tests, and callers that want the events after the loop)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def metrics_log(sink: Sink | None) -> Callable[[int, dict[str, float]], None] | None:
    """`log(step, values)` for loops that report only metrics (SFT, reward model)."""
    return None if sink is None else lambda step, values: sink.emit(Metrics(values, step))


def encode(event: Event) -> str:
    """One JSON line: `{"event": <class name>, ...fields}`."""
    return json.dumps({"event": type(event).__name__, **asdict(event)})


def decode(line: str) -> Event:
    obj = json.loads(line)
    kind = EVENT_TYPES.get(obj.pop("event", None))
    if kind is None or set(obj) != {f.name for f in fields(kind)}:
        raise ValueError(f"not an event line: {line[:200]!r}")
    return kind(**obj)


class EventWriter:
    """A sink that appends each event to an open text file as a JSON line, flushed at once (it is read while
    being written)."""

    def __init__(self, feed: IO[str]):
        self.feed = feed

    def emit(self, event: Event) -> None:
        self.feed.write(encode(event) + "\n")
        self.feed.flush()


def read_events(feed: IO[str]) -> Iterator[Event]:
    """The complete lines appended to `feed` since the last call, as events; a line still being written waits."""
    while True:
        pos = feed.tell()
        line = feed.readline()
        if not line.endswith("\n"):
            feed.seek(pos)
            return
        yield decode(line)
