"""Progress lines when output is not a terminal: one per stage at most every period, always at the last step, with
an ETA from the mean step time so far."""

from __future__ import annotations

from cli.console import LineProgress, clock


def test_progress_lines_are_throttled_and_carry_an_eta():
    lines, t = [], [0.0]
    p = LineProgress(lines.append, every_s=30.0, now=lambda: t[0])
    for step in range(1, 11):  # 10 s a step, the first report starts the clock
        t[0] = 10.0 * step
        p("sft", step, 10, {"loss": 1.5})
    assert lines == ["sft: step 4/10 (40 %)  loss 1.5  elapsed 0:30  eta 1:00",
                     "sft: step 7/10 (70 %)  loss 1.5  elapsed 1:00  eta 0:30",
                     "sft: step 10/10 (100 %)  loss 1.5  elapsed 1:30  eta done"]
    p("sft", 1, 5, {})  # the stage runs again (another seed): a new clock
    t[0] = 1000.0
    p("sft", 5, 5, {})
    assert lines[-1] == "sft: step 5/5 (100 %)  elapsed 15:00  eta done"
    assert clock(3725) == "1:02:05"
    p("ppo", 1, 2, {})
    t[0] = 1100.0
    p("ppo", 2, 2, {"score": 1.0})
    p("ppo", 2, 2, {"score": 1.0})  # PPO reports its last iteration again after the held-out eval: no new run
    assert lines[-1] == "ppo: step 2/2 (100 %)  score 1  elapsed 1:40  eta done" and len(lines) == 5
    p("one", 1, 1, {})  # a stage of one step still says it is done
    assert lines[-1] == "one: step 1/1 (100 %)  elapsed 0:00  eta done"
