"""The built-in tasks behind one protocol (`rlhf_lib.task_protocol.Task`), by name, and how a stage finds one: by the
config (`task_for_config`) before the data exists, by what the data stage recorded (`task_of_data`) after. The stages
call this module, never a task's own package (a test pins it).

Each task is imported here by name, not looked up by a string, so a stage's cache key covers every task's code
(`stages.code_deps` follows imports): an edited gold judge reruns the stages that read it.
Adding a task: its package with a `task.py`, one line in `TASKS`, a preset (docs/architecture.md, "Adding a task").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rlhf_lib.arith_task.task import TASK as ARITHMETIC
from rlhf_lib.demo_task.task import TASK as DEMO
from rlhf_lib.task_protocol import (
    BaseTask,
    BuiltData,
    ConstantReply,
    Digests,
    GoldJudge,
    ReportSection,
    Scorer,
    Task,
)
from rlhf_lib.user_task.task import TASK as USER

if TYPE_CHECKING:
    from rlhf_lib.config import DataConfig

TASKS: dict[str, Task] = {task.name: task for task in (DEMO, ARITHMETIC, USER)}

__all__ = ["TASKS", "BaseTask", "BuiltData", "ConstantReply", "Digests", "GoldJudge", "ReportSection", "Scorer",
           "Task", "task_for_config", "task_named", "task_of_data"]


def task_named(name: str) -> Task:
    """The task registered as `name`, or a refusal naming the known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; the tasks are: {', '.join(TASKS)}")
    return TASKS[name]


def task_for_config(data: DataConfig) -> Task:
    """The task that builds the data of this config: `user` when it names user data, else `data.task`."""
    return task_named("user" if data.user_data else data.task)


def task_of_data(data_dir: Path) -> Task:
    """The task that built a data stage's artifact (`source.json`'s `source`), or a refusal naming the file."""
    path = Path(data_dir) / "source.json"
    try:
        source = json.loads(path.read_text())["source"]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a data stage's record of its task ({e})") from e
    return task_named(source)
