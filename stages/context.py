"""Identities shared by the stages of one pipeline run, and this node's place in a multi-node run."""

from __future__ import annotations

from pydantic import BaseModel

from rlhf_lib.config import ResourcesConfig


class RunContext(BaseModel):
    """Identities shared by the stages of one pipeline run (small and JSON-able: a sub-flow parameter), and this
    node's place in a multi-node run (each stage sets it from its `resources`: `on_node`)."""

    experiment_id: str
    parent_run_id: str  # "" on a node that keeps no pipeline run of its own (machine_rank > 0)
    force: list[str] = []
    machine_rank: int = 0
    rdzv_timeout_s: float = 300.0


def on_node(ctx: RunContext, resources: ResourcesConfig) -> RunContext:
    """`ctx` on the node `resources` describes: the stage's own config decides the node's role, whatever started it
    (the flow, a deployment on a work pool). One machine: `ctx` as it is."""
    if resources.num_machines == 1:
        return ctx
    return ctx.model_copy(update={"machine_rank": resources.machine_rank, "rdzv_timeout_s": resources.rdzv_timeout_s})
