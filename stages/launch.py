"""Running a job in `resources.num_processes` processes per machine under `accelerate launch`: any
`module:function` entry point, with a JSON-able job; this module knows no stage.

The parent (`run_job`) writes the job to a temporary directory, starts `accelerate launch -m stages.launch JOB`,
and hands every event the launched processes append to `events.jsonl` (`rlhf_lib.events`) to its sink as they come.
Each launched process (`worker`, this module's `__main__`, which imports neither Prefect nor MLflow) imports the
entry point and calls `entry(job, workdir, sink)`. A launch that fails raises `LaunchError` with the first worker
exception and the tail of its stderr, so the stage fails and nothing is registered.

With `resources.num_machines` > 1 every node calls `run_job` for the same job: the nodes first meet at
`resources.rdzv_endpoint` (`stages.rendezvous`), then each launches its `resources.num_processes` processes with fixed
ranks, node 0 first, on the endpoint's next port. Their process group times out after `resources.rdzv_timeout_s`,
so a node that dies or hangs mid-run fails the others within it, not after the backends' default of 30 minutes.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf_lib.config import ResourcesConfig
from rlhf_lib.devices import resolve_device
from rlhf_lib.distributed import TIMEOUT_ENV
from rlhf_lib.events import EventWriter, Sink, read_events
from stages.net import free_port
from stages.rendezvous import RendezvousError, endpoint, launch_port, meet

PROJECT = Path(__file__).resolve().parent.parent
CONFIG_DIR = PROJECT / "configs" / "accelerate"
STDERR_TAIL = 60  # lines of the workers' stderr quoted in a launch error
Entry = Callable[[dict[str, Any], Path, Sink], None]


class LaunchError(RuntimeError):
    """`accelerate launch` ended with an error; the message quotes its command and the tail of its stderr."""


def resolve_config(resources: ResourcesConfig) -> Path:
    """The Accelerate config file: as given (working directory, then configs/accelerate/), else the default of
    `resources.device`: DDP over NCCL on GPUs, gloo on CPUs.

    The file says how the processes train (DDP, FSDP, ZeRO); `resources` says where, and the stage passes it on the
    command line, over the file's `num_processes`, `machine_rank`, `main_process_ip` and port. A file written for
    one machine serves any number of them; one whose `num_machines` is not 1 must agree with
    `resources.num_machines`, or a user who picked a multi-node file but left the resources at one machine would
    get every node training on its own."""
    import yaml

    name = resources.accelerate_config or default_config(resources.device)
    path = next((p.resolve() for p in (Path(name), CONFIG_DIR / name) if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(f"resources.accelerate_config: no file {name!r} in {Path.cwd()} or {CONFIG_DIR}")
    machines = (yaml.safe_load(path.read_text()) or {}).get("num_machines", 1)
    if machines not in (1, resources.num_machines):
        raise ValueError(f"resources.accelerate_config {path}: num_machines is {machines} but "
                         f"resources.num_machines is {resources.num_machines}; the stage places the processes by "
                         "resources (num_machines, machine_rank, rdzv_endpoint): set them, or use a one-machine file")
    return path


def default_config(device: str) -> str:
    """The Accelerate config file of a device when none is given: ddp.yaml on a GPU, cpu_gloo.yaml on the CPU."""
    return "ddp.yaml" if resolve_device(device).type == "cuda" else "cpu_gloo.yaml"


def entry_name(entry: Entry) -> str:
    """`module:function` of an entry point (a module-level function)."""
    return f"{entry.__module__}:{entry.__qualname__}"


def run_job(entry: Entry, job: dict[str, Any], resources: ResourcesConfig, workdir: Path, sink: Sink,
            torch_threads: int = 1, mixed_precision: str | None = None, launch_id: str = "") -> None:
    """Run `entry(job, workdir, sink)` in `resources.num_processes` processes under `accelerate launch`, passing the
    events they write to `sink` as they come. `workdir` is shared by the processes (the entry puts its outputs
    there). Raises `LaunchError` when the launch fails.

    With `resources.num_machines` > 1 every node calls this with the same `launch_id` (the stage and its cache key)
    and its own `resources.machine_rank`; the outputs and the events are node 0's (global rank 0 is there), a
    follower's `workdir` gets neither."""
    config_file = resolve_config(resources)
    precision = mixed_precision or resources.mixed_precision
    spec = {"entry": entry_name(entry), "job": job, "threads": max(1, torch_threads // resources.num_processes)}
    (workdir / "job.json").write_text(json.dumps(spec))
    # `accelerate launch` with torchrun's store on the main process address only (`stages.bound_launch`).
    cmd = [sys.executable, "-m", "stages.bound_launch", "--config_file", str(config_file),
           *placement(resources), "--mixed_precision", precision, "-m", "stages.launch", str(workdir / "job.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    if resources.num_machines == 1:
        # gloo's pairs and NCCL's bootstrap on loopback too (a multi-homed machine would offer its other addresses).
        if sys.platform == "linux":
            env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", **env}
        _run(cmd, env, workdir, sink)
        return
    env[TIMEOUT_ENV] = str(resources.rdzv_timeout_s)
    try:
        with meet(resources, launch_id or entry_name(entry)):
            _run(cmd, env, workdir, sink)
    except RendezvousError as e:
        raise LaunchError(str(e)) from None


def placement(resources: ResourcesConfig) -> list[str]:
    """The launcher's arguments that place the processes. One machine: `num_processes` on a free port. Several:
    Accelerate counts processes over all machines (it starts num_processes / num_machines per node), ranks are
    fixed (static rendezvous, node 0 hosting it on the endpoint's next port), and torchrun's own wait for the
    nodes is bounded by `resources.rdzv_timeout_s` too."""
    if resources.num_machines == 1:
        return ["--num_processes", str(resources.num_processes), "--main_process_port", str(free_port())]
    host, _ = endpoint(resources)
    return ["--num_processes", str(resources.num_processes * resources.num_machines),
            "--num_machines", str(resources.num_machines), "--machine_rank", str(resources.machine_rank),
            "--main_process_ip", host, "--main_process_port", str(launch_port(resources)),
            "--rdzv_backend", "static", "--rdzv_conf", f"timeout={math.ceil(resources.rdzv_timeout_s)}",
            "--same_network"]


def _run(cmd: list[str], env: dict[str, str], workdir: Path, sink: Sink) -> None:
    """Run the launcher, forwarding its events while it runs; on failure raise with its stderr tail."""
    events = workdir / "events.jsonl"
    events.touch()
    with open(workdir / "stdout.log", "wb") as out, open(workdir / "stderr.log", "wb") as err, open(events) as feed:
        # Its own session, so that an interrupted stage can stop every worker the launcher started.
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)
        try:
            while proc.poll() is None:
                for event in read_events(feed):
                    sink.emit(event)
                time.sleep(0.5)
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
        for event in read_events(feed):
            sink.emit(event)
    if proc.returncode != 0:
        lines = (workdir / "stderr.log").read_text(errors="replace").splitlines()
        raise LaunchError(f"`{' '.join(cmd[1:])}` exited with {proc.returncode}: {root_cause(lines)}\n"
                          "last lines of its stderr:\n" + "\n".join(lines[-STDERR_TAIL:]))


def root_cause(lines: list[str]) -> str:
    """The first worker's exception line (torchrun prefixes a worker's stderr with `[rankN]: `), else the
    launcher's own last one: the headline of a launch error."""
    exc = re.compile(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception|Interrupt)\b.*")
    found = [ln for ln in lines if exc.match(ln) and "ChildFailedError" not in ln]
    ranked = [ln for ln in found if ln.startswith("[rank")]
    return (ranked or found or ["(no exception line in stderr)"])[0]


def worker(job_path: Path) -> None:
    """One launched process: import the entry point and call it on the job, its events appended to the shared
    events file."""
    from rlhf_lib.process import configure_process

    spec = json.loads(job_path.read_text())
    configure_process(spec["threads"])
    module, _, name = spec["entry"].partition(":")
    entry = getattr(importlib.import_module(module), name)
    with open(job_path.parent / "events.jsonl", "a") as feed:
        entry(spec["job"], job_path.parent, EventWriter(feed))
    # The entry wrote its results and closed its process group (`ProcessGroup.close`, which keeps the group alive):
    # leave without the interpreter's teardown, which would free the group and can deadlock in gloo's destructor.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
