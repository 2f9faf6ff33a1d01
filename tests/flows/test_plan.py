"""`rlhf plan` prints each stage's memory and exits 1 with the refusal when one does not fit; a CUDA out-of-memory
error, raised here or quoted by a launched process, ends a command with one message naming the keys to change."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from cli.errors import QuietUserErrors, user_error
from cli.main import main
from stages.launch import LaunchError

# The demo preset's learning rates and lengths are sized for the tiny model; only memory is looked at here.
pytestmark = pytest.mark.filterwarnings("ignore::flows.settings.TinyDefaultsWarning")
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free."


def test_plan_prints_every_stage_and_fits(capsys):
    assert main(["plan", "--shape", "gpt2-124m", "--set", "model.n_positions=1024", "--budget-gb", "80"]) == 0
    out = capsys.readouterr().out
    assert "policy: 124,439,808 parameters" in out
    for stage in ("sft", "reward", "ppo", "eval"):
        assert f"│ {stage}" in out


def test_plan_json_matches_the_hand_calculation(capsys):
    assert main(["plan", "--shape", "gpt2-124m", "--stage", "ppo", "--json"]) == 0
    (ppo,) = json.loads(capsys.readouterr().out)["stages"]
    assert ppo["by_kind"]["weights"] == 4 * (2 * 124_439_808 + 2 * 124_440_576) and ppo["fits"]


def test_plan_refuses_over_budget_with_exit_code_1_and_no_traceback():
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    out = subprocess.run([sys.executable, "-m", "cli.main", "plan", "--shape", "qwen2.5-1.5b", "--stage", "ppo",
                          "--set", "model.n_positions=1024", "--set", "ppo.max_new_tokens=256", "--set",
                          "ppo.minibatches=1", "--budget-gb", "80"], capture_output=True, text=True, env=env,
                         timeout=300, check=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "rlhf: out of memory: the ppo stage needs about" in out.stderr
    assert "ppo.micro_batch_tokens / ppo.gradient_accumulation_steps" in out.stderr
    assert "│ ppo" in out.stdout and "no" in out.stdout


def test_cuda_out_of_memory_is_one_message_naming_keys():
    message = user_error(torch.OutOfMemoryError(OOM))
    assert message.startswith(f"out of device memory: {OOM}")
    assert "ppo.micro_batch_tokens / ppo.gradient_accumulation_steps" in message and "sft.batch_size" in message
    assert "rlhf plan" in message
    try:  # wrapped by something else on its way up
        try:
            raise torch.OutOfMemoryError(OOM)
        except torch.OutOfMemoryError as e:
            raise RuntimeError("stage ppo failed") from e
    except RuntimeError as wrapped:
        assert user_error(wrapped).startswith("out of device memory: CUDA out of memory.")


def test_a_launched_process_out_of_memory_is_reported_the_same_way():
    launch = LaunchError("`accelerate.commands.launch -m stages.launch job.json` exited with 1: [rank0]: "
                         f"torch.OutOfMemoryError: {OOM}\nlast lines of its stderr:\n...")
    message = user_error(launch)
    assert message.startswith(f"out of device memory: torch.OutOfMemoryError: {OOM}")
    assert "resources.frozen_dtype=bfloat16" in message


def test_out_of_memory_tracebacks_stay_off_the_console():
    try:
        raise torch.OutOfMemoryError(OOM)
    except torch.OutOfMemoryError:
        record = logging.LogRecord("prefect", logging.ERROR, __file__, 1, "Encountered exception", None,
                                   sys.exc_info())
    assert not QuietUserErrors().filter(record)
