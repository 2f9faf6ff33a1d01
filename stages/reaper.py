"""What a killed `rlhf` process leaves in the store, put right by the next run on the same machine.

Every run this pipeline opens carries the host, process id and process start time of its owner (`owner_tags`). At
the start of a pipeline run, `reap` finds the RUNNING runs of this host whose owner is gone (no such process, or the
id now belongs to a younger process), marks them FAILED with the reason in `rlhf.failure`, and deletes any model
version registered from them; `artifact_cache.clean_staging` removes their half-written outputs. They are tagged
`rlhf.interrupted`, as a Ctrl-C'd run is, so an interrupted PPO stage still resumes from its last checkpoint
(`stages.resume`). A run owned by
another machine is left alone: nothing here can tell whether its process lives.
"""

from __future__ import annotations

import logging
import socket

from stages.owner import HOST, PID, owner_alive
from stages.tracking import MODEL_NAMES, RetryingClient, store_call

_log = logging.getLogger(__name__)
def reap(experiment_id: str, client: RetryingClient | None = None) -> list[str]:
    """Mark the RUNNING runs of this host whose owner process is gone FAILED and delete the model versions
    registered from them; returns their run ids."""
    import mlflow

    client = client or RetryingClient()
    host = socket.gethostname().replace("'", "")
    runs = store_call("search_runs", mlflow.search_runs, [experiment_id],
                      filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST}` = '{host}'",
                      output_format="list", max_results=500)
    reaped = []
    for run in runs:
        if owner_alive(run.data.tags):
            continue
        run_id = run.info.run_id
        client.set_tag(run_id, "rlhf.failure", f"its process (pid {run.data.tags.get(PID)} on {host}) ended "
                       "without finishing it (killed?); marked FAILED by the next run")
        client.set_tag(run_id, "rlhf.interrupted", "true")  # a PPO run still resumes from its checkpoints
        client.set_terminated(run_id, "FAILED")
        stage = run.data.tags.get("rlhf.stage")
        if stage in MODEL_NAMES:
            for mv in client.search_model_versions(f"name = '{MODEL_NAMES[stage]}' and run_id = '{run_id}'"):
                client.delete_model_version(MODEL_NAMES[stage], mv.version)
        reaped.append(run_id)
    if reaped:
        _log.warning("marked %d run(s) of a killed process FAILED: %s", len(reaped), ", ".join(reaped))
    return reaped
