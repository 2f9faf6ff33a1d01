"""The task protocol: what the stages need from a task, and nothing of its insides.

A task is one package (`rlhf_lib.demo_task`, `rlhf_lib.arith_task`, `rlhf_lib.user_task`) whose `task.py` holds one
object that satisfies `Task`. The stages find it through `rlhf_lib.tasks` by the config (`data.task`, or
user data) or by what a data stage recorded (`source.json`), and call these methods only:

- `identity` and `build`: the data stage's cache key and the contract's files (`rlhf_lib.data.contract`);
- `gold`: the task's own judge (the demo's hidden gold judge), where it has one; `split_digits`: how a tokenizer
  trained on its data splits numbers;
- `gold_groups` and `constant_reply`: task-specific baselines in the eval report;
- `rm_report_sections`: sections the task adds to the reward model's report.

`BaseTask` gives every optional part its "none" answer, so a task overrides only what it has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rlhf_lib.config import PipelineConfig
    from rlhf_lib.data.chat import Renderer

Scorer = Callable[[list[str], list[str]], list[float]]  # (prompts, responses) -> a score of each reply
Bounds = dict[str, tuple[float, float]]  # 95 % interval of each figure, by name


@dataclass(frozen=True)
class GoldJudge:
    """A task's own judge of a reply: `score(prompt, response)` and its terms one by one
    (`breakdown(prompt, response)`: {term: value}), named in reports as `name`."""

    score: Callable[[str, str], float]
    breakdown: Callable[[str, str], dict[str, float]]
    name: str
    terms: tuple[str, ...] = ()


@dataclass(frozen=True)
class Digests:
    """Content identities the data stage's key needs and only the stage layer can compute: a configured model's
    (`model(name_or_path, revision)`) and a folder's (`folder(path)`)."""

    model: Callable[[str | None, str | None], str]
    folder: Callable[[Path], str]


@dataclass(frozen=True)
class BuiltData:
    """What `Task.build` wrote and recorded. `paths`: the contract's files by key; `name`: the prefix of their MLflow
    data set names; `source`: `source.json` (the stage adds `rows`); `metrics` and `tags` for the data run beside the
    row counts; `conversations`: the messages behind each rendered prompt, to write, or None; `warnings`: lines the
    stage logs."""

    paths: Mapping[str, Path]
    name: str
    source: Mapping[str, Any]
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    conversations: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConstantReply:
    """A task's best constant reply in the eval report: its figures and intervals, and the reply itself."""

    metrics: dict[str, float]
    bounds: Bounds
    template: str


@dataclass(frozen=True)
class ReportSection:
    """A section a task adds to a report, as data: a title, a paragraph, then tables (each a list of rows) under
    their captions ("" for none). The stage renders it."""

    title: str
    text: str
    tables: tuple[tuple[str, tuple[Mapping[str, Any], ...]], ...] = ()


class Task(Protocol):
    """The protocol the stages call (module docstring)."""

    name: str
    gold: GoldJudge | None
    split_digits: bool  # a tokenizer trained here gives every digit a token of its own (answers read digit by digit)

    def identity(self, cfg: PipelineConfig, digests: Digests) -> tuple[dict[str, Any], str]:
        """The data stage's key section and its data fingerprint: what, besides the code, changes the files."""
        ...

    def build(self, cfg: PipelineConfig, out_dir: Path, renderer: Renderer) -> BuiltData:
        """Write the contract's files under `out_dir` (`renderer`: the policy's chat template, for tasks that render
        conversations)."""
        ...

    def gold_groups(self, prompts: Sequence[str], policy_gold: Sequence[float],
                    sft_gold: Sequence[float]) -> tuple[dict[str, float], Bounds]:
        """The gold figures by groups of eval prompts the task defines, with intervals; ({}, {}) for none."""
        ...

    def constant_reply(self, val_prompts: Sequence[str], prompts: Sequence[str], score: Scorer,
                       policy_gold: Sequence[float]) -> ConstantReply | None:
        """The best constant reply, picked with `score` (the RM) on `val_prompts` and judged by gold on `prompts`
        beside the policy's gold; None for a task without one."""
        ...

    def rm_report_sections(self, report: Mapping[str, Any]) -> list[ReportSection]:
        """Sections for the reward model's report (`report`: `rlhf_lib.reward_report`'s dict)."""
        ...


class BaseTask:
    """Every optional part of `Task` answered "none": a task without a judge, groups, constant reply or sections."""

    name = ""
    gold: GoldJudge | None = None
    split_digits = False

    def gold_groups(self, prompts: Sequence[str], policy_gold: Sequence[float],
                    sft_gold: Sequence[float]) -> tuple[dict[str, float], Bounds]:
        return {}, {}

    def constant_reply(self, val_prompts: Sequence[str], prompts: Sequence[str], score: Scorer,
                       policy_gold: Sequence[float]) -> ConstantReply | None:
        return None

    def rm_report_sections(self, report: Mapping[str, Any]) -> list[ReportSection]:
        return []
