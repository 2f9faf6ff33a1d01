"""Where the nodes of a multi-node stage meet before launching (`resources.num_machines` > 1).

Every node runs the same stage of the same pipeline, each with its own `resources.machine_rank`. Before its
`accelerate launch`, each one reports at `resources.rdzv_endpoint` through a c10d `TCPStore`: node 0 hosts it, the
others connect. Each node writes its rank under the launch's own id (the stage and its cache key), so nodes meet
only for the same job: a node that is at another stage, or found this one in its cache, never passes for a partner.
Node 0 keeps the store open while its launch runs, so that a late follower finds it, or a follower of another launch
times out naming what it waited for instead of reaching a store that just closed.

The store listens on the endpoint's host only (the interface the nodes share, through `TCPStore`'s
`master_listen_fd`), and a node proves at join that it holds the shared secret `RLHF_RDZV_SECRET` (an HMAC of the
launch id and its rank, checked by node 0, and node 0's checked by each follower): a process that is not one of the
nodes cannot pass for one. torchrun's own store, on the endpoint's next port, listens on that host only too
(`stages.bound_launch`) but has no such check.

Meeting first, rather than leaving it to torchrun, turns a node that never came into an error within
`resources.rdzv_timeout_s` that names the missing machine ranks and the endpoint, before any model is loaded. The
launch itself then uses the endpoint's next port with fixed ranks (torchrun's static rendezvous), so global rank 0,
which writes the outputs, is on node 0.

This module imports neither Prefect nor MLflow: the launcher module imports it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import time
from collections.abc import Iterator
from datetime import timedelta

from rlhf_lib.config import ResourcesConfig
from stages.net import port_open

POLL_S = 0.2  # how often a node looks again for the others
SECRET_ENV = "RLHF_RDZV_SECRET"


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


def secret() -> bytes:
    """The nodes' shared secret from `RLHF_RDZV_SECRET`; a `RendezvousError` naming the variable when unset."""
    value = os.environ.get(SECRET_ENV, "")
    if not value:
        raise RendezvousError(f"{SECRET_ENV} is not set: with resources.num_machines > 1 every node needs the same "
                              f"secret in it (e.g. export {SECRET_ENV}=$(python -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))') on one node, and the same value on the others)")
    return value.encode()


def proof(key: bytes, launch_id: str, rank: int) -> str:
    """What node `rank` writes for `launch_id`: an HMAC-SHA256 of both under the shared secret."""
    return hmac.new(key, f"{launch_id}/{rank}".encode(), hashlib.sha256).hexdigest()


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

    from stages.bound_launch import store_on

    key = secret()
    host, port = endpoint(resources)
    timeout = resources.rdzv_timeout_s
    try:
        store = store_on(lambda fd: TCPStore(host, port, is_master=True, wait_for_workers=False,  # this host only
                                             timeout=timedelta(seconds=timeout), master_listen_fd=fd), host, port)
    except (OSError, RuntimeError) as e:  # the port is taken (e.g. by another pipeline's node 0), or no such address
        raise RendezvousError(f"node 0 cannot host the rendezvous at {resources.rdzv_endpoint} "
                              f"(resources.rdzv_endpoint): {e}") from e
    store.set(f"{launch_id}/0", proof(key, launch_id, 0))
    missing = list(range(1, resources.num_machines))
    deadline = time.monotonic() + timeout
    while missing:
        missing = [r for r in missing if not store.check([f"{launch_id}/{r}"])]
        for r in set(range(1, resources.num_machines)) - set(missing):
            if not hmac.compare_digest(store.get(f"{launch_id}/{r}").decode(errors="replace"),
                                       proof(key, launch_id, r)):
                raise RendezvousError(f"a node joined {launch_id} at {resources.rdzv_endpoint} as machine_rank {r} "
                                      f"without the shared secret ({SECRET_ENV} differs, or it is not a node)")
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
        del store  # the server thread stops with its last reference, and closes its socket


def _join(resources: ResourcesConfig, launch_id: str) -> None:
    from torch.distributed import TCPStore

    key = secret()
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
    if not hmac.compare_digest(store.get(f"{launch_id}/0").decode(errors="replace"), proof(key, launch_id, 0)):
        raise RendezvousError(f"machine_rank {resources.machine_rank}: the node hosting {resources.rdzv_endpoint} "
                              f"does not hold this node's {SECRET_ENV}: not node 0 of this pipeline, or the secrets "
                              "differ")
    store.set(f"{launch_id}/{resources.machine_rank}", proof(key, launch_id, resources.machine_rank))
