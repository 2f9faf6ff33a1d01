"""The write batching of the Prefect servers `rlhf` starts: the environment wins, and batching loses no task run."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

from services.prefect_tuning import SERVER_BATCHING, server_batching

TASK_RUNS = 24  # fewer than the recorder's batch of 100: all of them wait in the batch until the server stops


def test_batching_fills_in_only_what_the_environment_leaves_unset():
    key = "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"
    assert server_batching({}) == SERVER_BATCHING
    assert server_batching({key: "1"}) == {k: v for k, v in SERVER_BATCHING.items() if k != key}


def test_the_throwaway_server_records_every_task_run_held_in_a_batch_when_it_stops(tmp_path):
    script = textwrap.dedent(f"""
        import os
        from services.ephemeral import EphemeralPrefect
        server = EphemeralPrefect()
        os.environ["PREFECT_API_URL"] = server.api_url
        server.wait()
        from prefect import flow, task

        @task(name="step")
        def step(i):
            return i

        @flow(name="batched")
        def batched():
            return sum(step(i) for i in range({TASK_RUNS}))

        assert batched() == {sum(range(TASK_RUNS))}
        server.stop()
    """)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    for key in ("PREFECT_API_URL", *SERVER_BATCHING):
        env.pop(key, None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    with sqlite3.connect(tmp_path / "prefect.db") as db:
        rows = db.execute("SELECT state_type, COUNT(*) FROM task_run GROUP BY state_type").fetchall()
    assert rows == [("COMPLETED", TASK_RUNS)]
