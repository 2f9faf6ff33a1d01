"""A launched entry point for tests/stages/test_loopback.py: joins the process group, then rank 0 lists every TCP
socket that listens in the launch's process tree (the launcher, torchrun's agent and the workers)."""

from __future__ import annotations

import json
from pathlib import Path


def listening(job: dict, workdir: Path, sink) -> None:
    import os

    import psutil
    import torch.distributed as dist

    from rlhf_lib.distributed import ProcessGroup

    group = ProcessGroup("no", "cpu")
    group.sum([1.0])  # the group is up: every store and gloo pair exists now
    if group.rank == 0:
        root = psutil.Process(os.getppid())  # accelerate's launcher, which runs torchrun's agent in-process
        tree = {root.pid, *(p.pid for p in root.children(recursive=True))}
        found = [(c.laddr.ip, c.laddr.port, c.pid) for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.pid in tree]
        (workdir / "listening.json").write_text(json.dumps({"listening": found, "pid": os.getpid()}))
    group.sum([1.0])
    if dist.is_initialized():
        dist.barrier()
