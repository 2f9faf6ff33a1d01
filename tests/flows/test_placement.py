"""A stage sent to a work pool, against a real (temporary) Prefect server: a missing deployment, one on another pool,
and a pool no worker serves are refused naming the deployment or the pool; the run nobody took is cancelled. (The
whole path with workers is tests/flows/test_work_pools.py.)"""

from __future__ import annotations

import time

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate

from flows.placement import PlacementError, check_deployment, wait_picked_up


@flow(name="rlhf")
def _rlhf() -> None:
    """Stands for the `rlhf` flow: only its name and deployments matter here."""


@pytest.fixture(scope="module")
def deployed(home):
    with get_client(sync_client=True) as client:
        for pool in ("cpu", "gpu"):
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
        flow_id = client.create_flow(_rlhf)
        client.create_deployment(flow_id, "ppo", work_pool_name="gpu", entrypoint="flows/pipeline.py:rlhf")
        client.create_deployment(flow_id, "eval", work_pool_name="cpu", entrypoint="flows/pipeline.py:rlhf")
        yield client


def test_the_deployment_must_exist_on_the_named_pool(deployed):
    check_deployment("ppo", "gpu")
    with pytest.raises(PlacementError, match=r"resources.work_pools.ppo='cpu', but deployment rlhf/ppo is on work "
                                             r"pool 'gpu'"):
        check_deployment("ppo", "cpu")
    with pytest.raises(PlacementError, match=r"no deployment rlhf/sft on the Prefect API .*prefect deploy --all"):
        check_deployment("sft", "gpu")


def test_a_run_no_worker_takes_is_cancelled_and_the_pool_named(deployed):
    deployment = deployed.read_deployment_by_name("rlhf/ppo")
    run = deployed.create_flow_run_from_deployment(deployment.id)
    t0 = time.monotonic()
    with pytest.raises(PlacementError) as e:
        wait_picked_up(run.id, run.name, "ppo", "gpu", timeout_s=3)
    assert time.monotonic() - t0 < 10
    assert "no worker of work pool 'gpu' picked up" in str(e.value) and "within 3 s" in str(e.value)
    assert "no online worker; start one with `prefect worker start --pool gpu`" in str(e.value)
    assert deployed.read_flow_run(run.id).state.type.value == "CANCELLED"
