"""Where the nodes of a multi-node stage meet before launching (`resources.num_machines` > 1).

Every node runs the same stage of the same pipeline, each with its own `resources.machine_rank`. Before its
`accelerate launch`, each one reports at `resources.rdzv_endpoint` through a c10d `TCPStore`: node 0 hosts it, the
others connect. Each node writes its rank under the launch's own id (the stage and its cache key), so nodes meet
only for the same job: a node that is at another stage, or found this one in its cache, never passes for a partner.
Node 0 keeps the store open while its launch runs, so that a late follower finds it, or a follower of another launch
times out naming what it waited for instead of reaching a store that just closed.

Meeting first, rather than leaving it to torchrun, turns a node that never came into an error within
`resources.rdzv_timeout_s` that names the missing machine ranks and the endpoint, before any model is loaded. The
launch itself then uses the endpoint's next port with fixed ranks (torchrun's static rendezvous), so global rank 0,
which writes the outputs, is on node 0.

This module imports neither Prefect nor MLflow: the launcher module imports it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

from rlhf_lib.config import ResourcesConfig
from stages.net import port_open

POLL_S = 0.2  # how often a node looks again for the others


class RendezvousError(RuntimeError):
    """The nodes did not all meet within `resources.rdzv_timeout_s`; the message names who and where."""


class FollowerDone(Exception):
    """This node (machine_rank > 0) did its part of a stage: its processes trained alongside node 0's, which alone
    saves, logs and registers the result. Raised where a stage's build launches, so that the build stops there;
    `stages.base.run_cached` catches it and waits for node 0's result in MLflow."""


def endpoint(resources: ResourcesConfig) -> tuple[str, int]:
    """(host, port) of `resources.rdzv_endpoint` (validated `host:port` by the config; `[::1]:29400` for IPv6)."""
    host, _, port = resources.rdzv_endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def launch_port(resources: ResourcesConfig) -> int:
    """The port of the launch itself (torchrun's static rendezvous, then the process group): the endpoint's next,
    so one documented pair of ports is all a firewall needs to open."""
    return endpoint(resources)[1] + 1


@contextlib.contextmanager
def meet(resources: ResourcesConfig, launch_id: str) -> Iterator[None]:
    """Meet the other nodes for `launch_id`, then run the body (the launch). Node 0 hosts the store for the whole
    body; a follower reports and leaves. Raises `RendezvousError` after `resources.rdzv_timeout_s`."""
    if resources.machine_rank == 0:
        with _host(resources, launch_id):
            yield
    else:
        _join(resources, launch_id)
        yield


@contextlib.contextmanager
def _host(resources: ResourcesConfig, launch_id: str) -> Iterator[None]:
    from torch.distributed import TCPStore

    host, port = endpoint(resources)
    timeout = resources.rdzv_timeout_s
    try:
        store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    except RuntimeError as e:  # DistNetworkError: the port is taken, e.g. by another pipeline's node 0
        raise RendezvousError(f"node 0 cannot host the rendezvous at {resources.rdzv_endpoint} "
                              f"(resources.rdzv_endpoint): {e}") from e
    store.set(f"{launch_id}/0", "here")
    missing = list(range(1, resources.num_machines))
    deadline = time.monotonic() + timeout
    while missing:
        missing = [r for r in missing if not store.check([f"{launch_id}/{r}"])]
        if missing and time.monotonic() > deadline:
            who = ", ".join(map(str, missing))
            raise RendezvousError(
                f"machine_rank {who} of {resources.num_machines} did not arrive at {resources.rdzv_endpoint} within "
                f"{timeout:g} s (resources.rdzv_timeout_s) for {launch_id}: start the same pipeline on every node, "
                "each with its resources.machine_rank")
        if missing:
            time.sleep(POLL_S)
    try:
        yield
    finally:
        del store  # the server thread stops with its last reference


def _join(resources: ResourcesConfig, launch_id: str) -> None:
    from torch.distributed import TCPStore

    host, port = endpoint(resources)
    timeout = resources.rdzv_timeout_s
    deadline = time.monotonic() + timeout
    # A plain TCP probe until node 0 listens: TCPStore's own connect retries sleep past its timeout, and log a
    # C++ stack trace for every try.
    while not port_open(host, port, timeout_s=min(1.0, max(0.1, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            raise RendezvousError(
                f"machine_rank {resources.machine_rank} could not reach node 0 at {resources.rdzv_endpoint} "
                f"(resources.rdzv_endpoint) within {timeout:g} s: is node 0 running this pipeline, and is the "
                "port open to this node?")
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    try:
        store = TCPStore(host, port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())))
        store.wait([f"{launch_id}/0"], timedelta(seconds=max(0.1, deadline - time.monotonic())))
    except RuntimeError:  # DistStoreError (the wait's timeout) or DistNetworkError (the store went away)
        raise RendezvousError(
            f"machine_rank {resources.machine_rank} reached {resources.rdzv_endpoint} but node 0 did not open "
            f"{launch_id} there within {timeout:g} s: node 0 is at another stage, found this one in its cache, or "
            "runs another config") from None
    store.set(f"{launch_id}/{resources.machine_rank}", "here")
