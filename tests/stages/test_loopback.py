"""Stores listen where they must only (issue 36, item 6): a one-machine launch listens on loopback alone
(stages/bound_launch.py pins torchrun's static rendezvous store), and the multi-node rendezvous listens on its
endpoint's host and refuses a node without the shared secret (stages/rendezvous.py)."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from datetime import timedelta

import pytest

from rlhf_lib.config import ResourcesConfig
from stages.launch import run_job
from stages.rendezvous import RendezvousError, meet, proof
from tests.stages.listen_entry import listening


class _Sink:
    def emit(self, event) -> None:
        pass


def test_a_one_machine_two_process_launch_listens_on_loopback_only(tmp_path):
    run_job(listening, {}, ResourcesConfig(num_processes=2, accelerate_config="cpu_gloo.yaml"), tmp_path, _Sink())
    found = json.loads((tmp_path / "listening.json").read_text())["listening"]
    assert len(found) >= 2  # torchrun's store and the workers' gloo pairs
    assert all(ipaddress.ip_address(ip).is_loopback for ip, _, _ in found), found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node0(port: int, timeout: float = 5.0) -> ResourcesConfig:
    return ResourcesConfig(num_processes=1, num_machines=2, machine_rank=0, rdzv_endpoint=f"127.0.0.1:{port}",
                           rdzv_timeout_s=timeout)


def test_node0_listens_on_the_endpoint_host_and_refuses_a_stranger(monkeypatch):
    from torch.distributed import TCPStore

    import psutil

    monkeypatch.setenv("RLHF_RDZV_SECRET", "s3cret")
    port = _free_port()
    errors: list[BaseException] = []

    def host() -> None:
        try:
            with meet(_node0(port), "sft-abc"):
                pass
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    thread = threading.Thread(target=host)
    thread.start()
    deadline = time.monotonic() + 10
    while not any(c.laddr.port == port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    listeners = [c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                 and c.laddr.port == port]
    assert listeners == ["127.0.0.1"]
    stranger = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5))
    stranger.set("sft-abc/1", "here")  # the old protocol's word: not the secret's proof
    thread.join(10)
    assert len(errors) == 1 and isinstance(errors[0], RendezvousError)
    assert "as machine_rank 1 without the shared secret (RLHF_RDZV_SECRET differs" in str(errors[0])
    assert proof(b"s3cret", "sft-abc", 1) != proof(b"other", "sft-abc", 1)


def test_a_multi_node_launch_needs_the_secret(monkeypatch):
    monkeypatch.delenv("RLHF_RDZV_SECRET", raising=False)
    with pytest.raises(RendezvousError, match="RLHF_RDZV_SECRET is not set"):
        with meet(_node0(_free_port()), "x"):
            pass
