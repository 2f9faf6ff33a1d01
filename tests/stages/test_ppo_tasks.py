"""The PPO sub-flow's task logging: the loop's four tasks log no per-call lifecycle line, failures still do."""

from __future__ import annotations

import logging

import pytest
from prefect import flow, task

from stages.ppo import LOOP_TASKS, QuietLoopTasks, quiet_loop_task_logs


class Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture()
def task_run_records():
    logger = logging.getLogger("prefect.task_runs")
    keep, filters = Keep(), list(logger.filters)
    logger.addHandler(keep)
    yield keep.records
    logger.removeHandler(keep)
    logger.filters[:] = filters


def _record(level: int, task_name: str | None) -> logging.LogRecord:
    record = logging.LogRecord("prefect.task_runs", level, __file__, 1, "Finished in state Completed()", None, None)
    if task_name is not None:
        record.task_name = task_name
    return record


def test_the_filter_drops_only_info_and_debug_lines_of_the_loop_tasks():
    f = QuietLoopTasks()
    assert LOOP_TASKS == {"rollout", "score", "gae", "update"}
    for name in LOOP_TASKS:
        assert not f.filter(_record(logging.INFO, name)) and not f.filter(_record(logging.DEBUG, name))
        assert f.filter(_record(logging.WARNING, name)) and f.filter(_record(logging.ERROR, name))
    assert f.filter(_record(logging.INFO, "publish")) and f.filter(_record(logging.INFO, None))


def test_prefect_task_runs_of_the_loop_finish_silently_and_fail_loudly(task_run_records):
    @task(name="score")
    def score(x):
        return x + 1

    @task(name="update")
    def update(x):
        raise ValueError(f"boom {x}")

    @task(name="publish")
    def publish(x):
        return x

    @flow(name="quiet-loop-tasks")
    def loop():
        quiet_loop_task_logs()
        quiet_loop_task_logs()  # idempotent: one filter
        publish(score(1))
        update(2)

    with pytest.raises(ValueError, match="boom 2"):
        loop()
    assert sum(isinstance(f, QuietLoopTasks) for f in logging.getLogger("prefect.task_runs").filters) == 1
    seen = [(r.task_name, r.levelno, r.getMessage().splitlines()[0]) for r in task_run_records]
    assert ("publish", logging.INFO, "Finished in state Completed()") in seen
    assert not [s for s in seen if s[0] == "score"]
    failed = [s for s in seen if s[0] == "update"]
    assert failed and all(level >= logging.WARNING for _, level, _ in failed)
