"""Write batching of the Prefect servers `rlhf` starts (the throwaway one of `rlhf run` and `rlhf up`'s).

Every Prefect task run sends its state changes (Pending, Running, Completed) to the server as events. Prefect 3.9's
task-run recorder writes each of them in its own database transaction (`batch_size` 1) and its event persister
flushes every 20; on a small machine that server CPU comes straight out of the cores torch trains on, four task runs
per PPO iteration. Writing in batches of 100 and 200 cuts it to about a third (`rlhf bench overhead` measures what
is left). The price is freshness: the UI shows a task run up to a flush interval (5 s, Prefect's default) after it
happened. Both services flush what they hold when the server
stops, so no task run is lost at exit (`tests/flows/test_prefect_tuning.py`).

A variable already set in the environment wins over these values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SERVER_BATCHING: dict[str, str] = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE": "50",
}


def server_batching(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The batching variables `environ` does not already set, to add to a Prefect server's environment."""
    return {key: value for key, value in SERVER_BATCHING.items() if key not in environ}
