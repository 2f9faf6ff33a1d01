"""A user's mistakes and dead services end `rlhf` with one message naming the key, file and line, URI or URL, and
what to do: no traceback unless --debug. Each fails fast, before any training."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stages.net import free_port
from tests.flows.procs import kill_all

HH = Path(__file__).resolve().parents[1] / "fixtures" / "hh_rlhf" / "harmless-240.jsonl"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    full_env.pop("PREFECT_API_URL", None) if "PREFECT_API_URL" not in env else None
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          env=full_env, timeout=300)


def _one_message(out: subprocess.CompletedProcess) -> str:
    """The command failed with exit code 2 and its `rlhf:` message, and printed no traceback."""
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.stderr[out.stderr.index("rlhf: "):]


def test_dead_prefect_api_is_named_within_seconds(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/api"
    t0 = time.monotonic()
    out = _run("run", "sft", "--preset", "micro", RLHF_HOME=str(tmp_path), PREFECT_API_URL=url)
    assert url in _one_message(out) and "rlhf up" in out.stderr
    assert time.monotonic() - t0 < 60  # fails fast, never hangs


def test_dead_mlflow_server_is_named(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    out = _run("run", "sft", "--preset", "micro", RLHF_HOME=str(tmp_path), MLFLOW_TRACKING_URI=url)
    assert url in _one_message(out)


def test_unknown_preset_key_and_missing_config_file_are_named(tmp_path):
    assert "unknown preset 'nope'" in _one_message(_run("run", "full", "--preset", "nope"))
    assert "missing.yaml does not exist" in _one_message(_run("run", "full", "--config", str(tmp_path / "missing.yaml")))
    message = _one_message(_run("run", "full", "--set", "ppo.kl_coeff=1"))
    assert message.strip() == "rlhf: bad config: --set: unknown config key 'ppo.kl_coeff'"


def test_a_bad_data_row_names_file_line_and_field_and_how_to_skip_it(tmp_path):
    # Real HH-RLHF data: row 69 of the fixture ends with "Assistant:" and no reply.
    out = _run("run", "sft", "--preset", "micro", "--set", f"data.preferences={HH}", RLHF_HOME=str(tmp_path))
    message = _one_message(out)
    assert f"rlhf: bad data: {HH}:69: field 'chosen': the conversation ends with an empty assistant reply" in message
    assert f"1 of the 240 rows of {HH} are bad" in message and "--set data.on_bad_row=skip" in message
    assert "Encountered exception" not in out.stderr  # Prefect's traceback of the failed flow run stays off


def test_a_missing_model_version_is_named_before_any_work(tmp_path):
    out = _run("run", "ppo", "--preset", "micro", "--reward-model", "models:/rlhf-reward/7", RLHF_HOME=str(tmp_path))
    assert "no registered model models:/rlhf-reward/7" in _one_message(out)
    assert "data: running" not in out.stderr  # nothing ran


def test_debug_shows_the_traceback(tmp_path):
    out = _run("--debug", "run", "full", "--set", "ppo.kl_coeff=1")
    assert out.returncode != 0 and "Traceback" in out.stderr and "ConfigError" in out.stderr


def test_sigterm_stops_the_temporary_prefect_server_with_the_run(tmp_path):
    # `kill` of a run must not leave Prefect's temporary server (a child process) running, orphaned to PID 1: the
    # run unwinds on SIGTERM, its atexit handlers stop the server, and it exits with 128 + 15.
    import psutil

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    with open(tmp_path / "stderr.log", "w") as log:  # not a pipe: an orphaned server would hold it open
        # PPO's 100,000 iterations keep the run going until the SIGTERM: a whole micro run can end within the
        # 2 s below on a fast host (it did: exit 0 where 143 was expected).
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "full", "--preset", "micro", "--set",
                                 "ppo.iterations=100000"],
                                env=env | {"RLHF_HOME": str(tmp_path)}, stdout=subprocess.DEVNULL, stderr=log)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 240
        while not any("prefect" in " ".join(c.cmdline()) for c in children):
            assert proc.poll() is None and time.monotonic() < deadline, "no temporary Prefect server appeared"
            time.sleep(0.5)
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                children = []
        time.sleep(2)
        assert proc.poll() is None, "the run ended before it could be terminated"
        proc.terminate()
        assert proc.wait(timeout=120) == 128 + 15
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [c.cmdline() for c in alive]
    finally:
        kill_all([proc, *children])


def test_a_device_this_machine_lacks_is_one_line_before_any_stage(tmp_path):
    # resources.device=cuda:7 exists on no test machine (the suite never needs a GPU).
    out = _run("run", "full", "--preset", "micro", "--set", "resources.device=cuda:7", RLHF_HOME=str(tmp_path))
    message = _one_message(out)
    assert message.startswith("rlhf: bad config: resources.device=cuda:7: ") and message.count("\n") == 1
    assert not (tmp_path / "mlflow.db").exists()  # no store opened, no data stage run


def test_config_file_refusals_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"sft:\n  lr: 1.0e-5\n  lr: \xff\n")
    message = _one_message(_run("run", "sft", "--config", str(bad), RLHF_HOME=str(tmp_path)))
    assert message.strip() == f"rlhf: bad config: {bad}:3: not UTF-8 text (byte 0xff at offset 24); save the file as UTF-8"
    bad.write_text("sft:\n  lr: 1.0e-5\n  lr: 2.0e-5\n")
    message = _one_message(_run("run", "sft", "--config", str(bad), RLHF_HOME=str(tmp_path)))
    assert message.strip() == f"rlhf: bad config: {bad}:3:3: invalid YAML: duplicate key 'lr' (first on line 2)"
    message = _one_message(_run("run", "sft", "--set", "sft.lr=.inf", RLHF_HOME=str(tmp_path)))
    assert "'sft.lr'" in message and "finite number" in message and message.count("\n") == 1
