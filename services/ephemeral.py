"""A throwaway Prefect API server for `rlhf run` when no server is configured.

Prefect would start the same server itself (`SubprocessASGIServer`), but only at the first API call, after our
torch/transformers imports, and only after importing its whole server stack in our process. Spawning it first,
without importing Prefect, lets its ~8 s start run on the other core while this process imports: a fully cached
`rlhf run full` takes ~8 s less. The command and environment are the ones Prefect itself uses, plus the write
batching of `services.prefect_tuning`; the app is Prefect's behind a Host check (`services.prefect_server`).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from services.prefect_tuning import server_batching
from stages.net import free_port, healthy


def _die_with(parent: int) -> None:
    """In the server's process before it execs (Linux): SIGTERM it when this process dies, even by SIGKILL, so that
    no server outlives its run (`prctl(PR_SET_PDEATHSIG)`; the parent may already be gone by then: exit)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


class EphemeralPrefect:
    """Start with `EphemeralPrefect()`, export `api_url`, then `wait()` before the first flow; `stop()` at exit."""

    def __init__(self) -> None:
        spec = importlib.util.find_spec("prefect")
        if spec is None or spec.origin is None:
            raise ImportError("prefect is not installed")
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.app_dir = str(Path(spec.origin).parent.parent)
        self.restarts = 0
        self.up = False  # answered its health check once
        self.process = self._spawn()
        atexit.register(self.stop)

    def _spawn(self) -> subprocess.Popen:
        env = {**os.environ, **server_batching(), "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1"}
        env.pop("PREFECT_API_URL", None)
        parent = os.getpid()
        return subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", self.app_dir, "--factory",
             "services.prefect_server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"],
            env=env, preexec_fn=lambda: _die_with(parent) if sys.platform == "linux" else None,
        )

    def wait(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                # Two first runs on one state dir race in the server database's migrations: the loser exits at
                # start-up (code 3) and succeeds once the other is done.
                if self.restarts < 3:
                    self.restarts += 1
                    time.sleep(1.0)
                    self.process = self._spawn()
                    continue
                code = self.process.returncode
                raise RuntimeError(f"the temporary Prefect server on {self.api_url} exited with {code}")
            if healthy(f"{self.api_url}/health"):
                self.up = True
                return
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the temporary Prefect server on {self.api_url} did not answer within {timeout_s:.0f} s")

    def ready(self) -> bool:
        """Whether the server answers now (no waiting)."""
        self.up = self.up or (self.process.poll() is None and healthy(f"{self.api_url}/health", 0.5))
        return self.process.poll() is None and self.up

    def stop(self, start_grace_s: float = 10.0) -> None:
        """Terminate the server. One still starting (this process failed early: a device it lacks, a dead store)
        gets up to `start_grace_s` to come up first: terminated inside its start-up's database work, it would print
        a cancelled query's traceback under the run's one-line error."""
        if self.process.poll() is None:
            deadline = time.monotonic() + start_grace_s
            while not self.up and self.process.poll() is None and time.monotonic() < deadline:
                self.up = healthy(f"{self.api_url}/health", 0.5)
                if not self.up:
                    time.sleep(0.1)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
