"""What `rlhf run` shows on the terminal: a progress bar per training stage (SFT and reward-model steps, PPO
iterations) with its key figures and an ETA while the pipeline runs, then a short table of the stages, the held-out
figures and where to look in both UIs.

On a terminal, Prefect's per-run INFO lines are kept off the screen while the bars run (they still reach the Prefect
server and its UI); warnings, such as PPO alarms, print above the bars. With `--json`, or when stderr is not a
terminal (CI, a pipe, a log file), nothing is drawn and Prefect's log lines print as usual, with a plain progress
line per training stage every `LINE_EVERY_S` seconds (and at its last step): steps done, key figures, elapsed time
and an ETA from the mean step time so far.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager

from rich.console import Console as RichConsole
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from cli.errors import quiet_user_errors
from rlhf_lib.intervals import split_intervals, with_interval
from stages import progress


class _ToProgress(logging.Handler):
    """Warnings and errors of the run, printed above the bars."""

    def __init__(self, console: RichConsole):
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.print(f"[yellow]{record.levelname.lower()}[/]: {record.getMessage()}", highlight=False)


LINE_EVERY_S = 30.0


def clock(seconds: float) -> str:
    """`1:02:03` / `4:05`: a duration as a log line shows it."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class LineProgress:
    """Progress as plain lines, for output that is not a terminal: `sft: step 12/24 (50 %)  loss 1.23  elapsed 1:02
    eta 1:02`, at most one line per stage every `every_s` seconds, and always at the last step."""

    def __init__(self, write=None, every_s: float = LINE_EVERY_S, now=time.monotonic) -> None:
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.every_s, self.now = every_s, now
        self.started: dict[str, tuple[float, int]] = {}
        self.last: dict[str, float] = {}
        self.step: dict[str, int] = {}

    def __call__(self, stage: str, step: int, total: int, figures: dict[str, float]) -> None:
        t = self.now()
        previous = self.step.get(stage)
        if previous == step:  # the same step again (PPO reports an iteration again after its held-out eval)
            return
        self.step[stage] = step
        if previous is None or step < previous:  # the first report, or steps went back: the stage runs again
            self.started[stage], self.last[stage] = (t, step), t
            if step < total:  # a stage that reports its last step first (one step, a resumed run) still ends
                return
        if step < total and t - self.last[stage] < self.every_s:
            return
        self.last[stage] = t
        t0, step0 = self.started[stage]
        elapsed = t - t0
        rate = elapsed / max(step - step0, 1)
        text = "  ".join(f"{k} {v:.3g}" for k, v in figures.items())
        eta = clock(rate * (total - step)) if step < total else "done"
        self.write(f"{stage}: step {step}/{total} ({100 * step // max(total, 1)} %)  {text}  elapsed "
                   f"{clock(elapsed)}  eta {eta}".replace("    ", "  "))


class Console:
    def __init__(self, quiet: bool = False, debug: bool = False):
        self.debug = debug
        self.quiet = quiet
        self.live_display = not quiet and sys.stderr.isatty() and not os.environ.get("CI")
        self.out = RichConsole(stderr=False, highlight=False)

    @contextmanager
    def live(self):
        """Around the pipeline run: the bars (on a terminal) or progress lines (elsewhere, unless quiet), and user
        errors' tracebacks kept off the screen."""
        if not self.debug:
            quiet_user_errors()
        if not self.live_display:
            progress.set_reporter(None if self.quiet else LineProgress())
            try:
                yield
            finally:
                progress.set_reporter(None)
            return
        bars = Progress(TextColumn("{task.description:<7}"), BarColumn(bar_width=30), MofNCompleteColumn(),
                        TextColumn("{task.fields[figures]}"), TimeElapsedColumn(), TextColumn("eta"),
                        TimeRemainingColumn(), console=RichConsole(stderr=True), transient=False)
        tasks: dict[str, int] = {}

        def report(stage: str, step: int, total: int, figures: dict[str, float]) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=total, figures="")
            text = "  ".join(f"{k} {v:.3g}" for k, v in figures.items())
            bars.update(tasks[stage], completed=step, total=total, figures=text)

        consoles = [h for h in logging.getLogger().handlers if type(h).__name__ == "PrefectConsoleHandler"]
        levels = [h.level for h in consoles]
        above = _ToProgress(bars.console)
        with bars:
            for h in consoles:
                h.setLevel(logging.CRITICAL + 1)
            logging.getLogger().addHandler(above)
            progress.set_reporter(report)
            try:
                yield
            finally:
                progress.set_reporter(None)
                logging.getLogger().removeHandler(above)
                for h, level in zip(consoles, levels):
                    h.setLevel(level)

    def summary(self, summary: dict) -> None:
        """The stages (status, time, model), the held-out figures, and where to look."""
        table = Table(title=f"rlhf run {summary['pipeline']}: {summary['status']} in {summary['seconds']:.0f} s",
                      title_justify="left")
        for col in ("stage", "status", "seconds", "model / MLflow run"):
            table.add_column(col)
        for stage, s in summary["stages"].items():
            table.add_row(stage, s["status"], f"{s['seconds']:.1f}",
                          s.get("model_uri") or s["mlflow_run_id"] or s.get("reason", ""))
        self.out.print(table)
        values, bounds = split_intervals(summary.get("eval") or {})
        figures = {k: v for k, v in values.items() if v is not None}
        if figures:
            what = "evaluation (policy vs SFT)" if summary["stages"].get("eval") else "figures"
            held = Table(title=f"held-out {what}, 95 % intervals", title_justify="left")
            held.add_column("figure")
            held.add_column("value [95 % interval]", justify="right")
            for k, v in figures.items():
                held.add_row(k, with_interval(v, bounds.get(k)))
            self.out.print(held)
        for line in where_to_look(summary):
            self.out.print(line)

    def seeds(self, result: dict) -> None:
        """Each seed's stages as `summary` prints them, then one table of the held-out figures: per seed with its
        95 % interval, and their mean and standard deviation over the seeds."""
        from cli.seeds import seed_rows

        for summary in result["seeds"].values():
            self.summary(summary)
        rows = seed_rows(result)
        if not rows:  # `rlhf run sft --seeds ...`: no held-out figure to compare
            return
        table = Table(title=f"held-out figures over {len(result['seeds'])} seeds (95 % intervals)",
                      title_justify="left")
        for col in rows[0]:
            table.add_column(col, justify="left" if col == "figure" else "right")
        for row in rows:
            table.add_row(*(row.get(c, "") for c in rows[0]))
        self.out.print(table)


def where_to_look(summary: dict) -> list[str]:
    """Links into the MLflow and Prefect UIs when `rlhf up` runs them, else how to open the local store."""
    from services.servers import urls
    from stages.home import state_dir
    from stages.net import healthy

    u = urls(state_dir())
    run_id, uri = summary["mlflow_run_id"], summary["mlflow_tracking_uri"]
    lines = []
    if healthy(f"{u['mlflow_ui']}/health", 1.0):
        lines.append(f"MLflow:  {u['mlflow_ui']}/#/experiments/{summary.get('mlflow_experiment_id', '')}/runs/{run_id}")
    else:
        lines.append(f"MLflow:  parent run {run_id} in {uri} (see it with `rlhf up`, then {u['mlflow_ui']})")
    if healthy(f"{u['prefect_api']}/health", 1.0) and os.environ.get("PREFECT_API_URL", "").startswith(u["prefect_ui"]):
        lines.append(f"Prefect: {u['prefect_ui']}/runs/flow-run/{summary['prefect_flow_run_id']}")
    if summary["stages"].get("eval"):
        lines.append(f"report:  report/report.html of MLflow run {summary['stages']['eval']['mlflow_run_id']}")
    return lines
