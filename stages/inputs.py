"""One resolution step per stage: what a stage needs from outside its config, resolved before its build.

A stage's flow calls its `resolve_*` once: the data artifact, file digests, imported models' folders, judges, the
environment's code, the RM's edge alarm and the memory plan become one frozen value (a subclass of `StageInputs`)
that holds the stage's cache key (section, upstream results, data fingerprint) and what its build reads. `run_stage`
looks the key up; on a miss it fetches the upstream models the build reads (`models`: after the look-up, so a
cache hit downloads none) and calls `build(run, out_dir, inputs, dirs)`. The build reads `inputs` and `dirs` and
never resolves anything itself: each resolver (`@resolver`) refuses to run inside a build (`ResolverInBuild`), so a
build that calls one fails every test that runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from rlhf_lib.memory import MemoryBudgetError
from rlhf_lib.memory import preflight as _preflight
from stages.artifact_cache import download
from stages.base import run_cached
from stages.cache import StageResult
from stages.context import RunContext
from stages.resolving import building, resolver
from stages.tracking import StageRun

@dataclass(frozen=True)
class MemoryCheck:
    """The memory plan's verdict for a stage (`rlhf_lib.memory.preflight`), resolved before the build: the build
    calls `enforce()` first, so a stage that cannot fit the device is refused before anything loads, and a cache hit
    (nothing loads) is never refused."""

    refusal: MemoryBudgetError | None = None

    def enforce(self) -> None:
        if self.refusal is not None:
            raise self.refusal


@resolver
def memory_check(cfg: Any, stage: str) -> MemoryCheck:
    try:
        _preflight(cfg, stage)
    except MemoryBudgetError as e:
        return MemoryCheck(e)
    return MemoryCheck()


def frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only view of a dict for a frozen input."""
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class StageInputs:
    """The resolved inputs every stage has: its cache key's parts (`section`, `upstream`, `fingerprint`), the upstream
    results whose artifacts the build reads (`models`, fetched on a miss), and the memory plan's verdict."""

    section: Mapping[str, Any]
    upstream: Mapping[str, StageResult]
    fingerprint: str
    models: Mapping[str, StageResult] = field(default_factory=lambda: MappingProxyType({}))
    memory: MemoryCheck = MemoryCheck()


I = TypeVar("I", bound=StageInputs)
Build = Callable[[StageRun, Path, I, Mapping[str, Path]], None]


def run_stage(ctx: RunContext, stage: str, inputs: I, build: Build, fetch: bool = False,
              variant: str | None = None) -> tuple[StageResult, Path | None]:
    """`stages.base.run_cached` on the resolved `inputs`: on a miss, the artifacts of `inputs.models` are fetched,
    then `build(run, out_dir, inputs, dirs)` runs with resolvers refused."""
    def run_build(run: StageRun, out_dir: Path) -> None:
        dirs = MappingProxyType({k: download(v.artifact_uri, v.digest) for k, v in inputs.models.items()})
        with building(stage):
            build(run, out_dir, inputs, dirs)

    return run_cached(ctx, stage, dict(inputs.section), dict(inputs.upstream), inputs.fingerprint, run_build,
                      fetch=fetch, variant=variant)
