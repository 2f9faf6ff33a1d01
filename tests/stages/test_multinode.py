"""Training across nodes: two "nodes" on 127.0.0.1 (one gloo process each, machine_rank 0 and 1, each launch in its own
thread as two machines would each run theirs) against the same job in two processes on one node.

The two launches compute the same thing: one global batch split over two processes, now in two process groups'
worth of launchers. So they agree up to float summation order, within the tolerances of test_ppo_loop.py (metrics
rel 1e-4 / abs 1e-5, clip fractions abs 0.05, weights rtol 1e-4 / atol 1e-5). Then the failures: a node that never
comes, a follower with no node 0, and a node that hangs mid-run, each within `resources.rdzv_timeout_s`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from rlhf_lib.config import ResourcesConfig, SFTConfig
from rlhf_lib.events import Metrics, Recorder
from rlhf_lib.model_dirs import load_causal_lm
from rlhf_lib.ppo.loop import launched
from stages.launch import LaunchError, placement, resolve_config, run_job
from stages.rendezvous import FollowerDone
from stages.sft import SFT_LOOP
from stages.supervised import train_supervised
from tests.stages.test_launch import TWO, _sft_data
from tests.stages.test_ppo_loop import _assert_same_metrics, _config, _job, _models

DIFFS: dict[str, float] = {}  # largest metric difference per test, printed with -s


def _ports() -> int:
    """A port P with P + 1 free too: the rendezvous and the launch."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two adjacent free ports")


@pytest.fixture(autouse=True)
def rdzv_secret(monkeypatch):
    """Every node of these tests holds the same shared secret (stages/rendezvous.py), as a user's nodes must."""
    monkeypatch.setenv("RLHF_RDZV_SECRET", "test-nodes-secret")


def _nodes(port: int, timeout: float = 60.0) -> list[ResourcesConfig]:
    return [ResourcesConfig(num_processes=1, num_machines=2, machine_rank=r, rdzv_endpoint=f"127.0.0.1:{port}",
                            rdzv_timeout_s=timeout, accelerate_config="cpu_gloo.yaml") for r in (0, 1)]


def _in_threads(*calls) -> list:
    """Run each call in its own thread, as each node runs its own; their results or exceptions, in order."""
    out: list = [None] * len(calls)

    def run(i, call):
        try:
            out[i] = call()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out[i] = e

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _largest_diff(one: list[Metrics], two: list[Metrics]) -> float:
    return max(abs(a.values[k] - b.values[k]) for a, b in zip(one, two) for k in a.values
               if not k.startswith("time/") and "clipfrac" not in k)


def test_placement_counts_processes_over_machines():
    node = _nodes(29400)[1].model_copy(update={"num_processes": 8})
    args = placement(node)
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--num_processes"] == "16"  # Accelerate's count is over every machine
    assert (flags["--num_machines"], flags["--machine_rank"], flags["--main_process_ip"]) == ("2", "1", "127.0.0.1")
    assert flags["--main_process_port"] == "29401"  # the rendezvous port's next
    assert "--same_network" in args and flags["--rdzv_conf"] == "timeout=60"
    assert placement(TWO)[:2] == ["--num_processes", "2"]


def test_two_nodes_train_sft_as_two_processes_do(tiny_tokenizer, tiny_policy):
    examples, cfg = _sft_data()
    cfg = cfg.model_copy(update={"epochs": 1})  # 3 steps, the last one's batch short: enough, and half the time
    rec2, rec0, rec1 = Recorder(), Recorder(), Recorder()
    m2, f2 = train_supervised("sft", SFT_LOOP, TWO, copy.deepcopy(tiny_policy), tiny_tokenizer, examples, cfg, rec2)
    node0, node1 = _nodes(_ports())
    t0 = time.perf_counter()
    got = _in_threads(
        lambda: train_supervised("sft", SFT_LOOP, node0, copy.deepcopy(tiny_policy), tiny_tokenizer, examples, cfg, rec0,
                                 launch_id="sft-test"),
        lambda: train_supervised("sft", SFT_LOOP, node1, copy.deepcopy(tiny_policy), tiny_tokenizer, examples, cfg, rec1,
                                 launch_id="sft-test"))
    print(f"two-node SFT: {time.perf_counter() - t0:.1f} s")
    assert isinstance(got[1], FollowerDone), got[1]  # the follower trained, node 0 has the model
    assert not isinstance(got[0], BaseException), got[0]
    m0, f0 = got[0]
    assert rec1.events == []  # events come from global rank 0, on node 0
    two, nodes = rec2.of(Metrics), rec0.of(Metrics)
    _assert_same_metrics(two, nodes)
    DIFFS["sft"] = _largest_diff(two, nodes)
    assert f0 == pytest.approx(f2, rel=1e-4, abs=1e-5)
    start, w2, w0 = tiny_policy.state_dict(), m2.state_dict(), m0.state_dict()
    assert any(not torch.equal(start[k], w2[k]) for k in w2)  # it trained
    for k in w2:
        torch.testing.assert_close(w0[k], w2[k], rtol=1e-4, atol=1e-5)


def test_two_nodes_train_ppo_as_two_processes_do(tmp_path, tiny_tokenizer, tiny_policy):
    sft, rm = _models(tmp_path, tiny_tokenizer, tiny_policy)
    # Every global statistic of test_ppo_loop's two-process test but the checkpoints, in 2 iterations.
    cfg = _config(iterations=2, rm_offset_samples=8, whiten_rewards=True, ptx_coef=0.1, ptx_batch_size=4)
    two = Recorder()
    (tmp_path / "two").mkdir()
    job2 = _job(tmp_path / "two", cfg, sft, rm).to_dict()
    run_job(launched, job2, TWO, tmp_path / "two", two, torch_threads=2, mixed_precision="no")
    recs = [Recorder(), Recorder()]
    for r in (0, 1):
        (tmp_path / f"node{r}" / "work").mkdir(parents=True)
    node0, node1 = _nodes(_ports())
    t0 = time.perf_counter()
    got = _in_threads(*(
        lambda r=r, node=node: run_job(launched, _job(tmp_path / f"node{r}", cfg, sft, rm).to_dict(), node,
                                       tmp_path / f"node{r}" / "work", recs[r], mixed_precision="no",
                                       launch_id="ppo-test")
        for r, node in ((0, node0), (1, node1))))
    print(f"two-node PPO: {time.perf_counter() - t0:.1f} s")
    assert got == [None, None], got
    assert recs[1].events == []
    _assert_same_metrics(two.of(Metrics), recs[0].of(Metrics))
    DIFFS["ppo"] = _largest_diff(two.of(Metrics), recs[0].of(Metrics))
    assert not (tmp_path / "node1" / "out").exists()  # the policy is saved by global rank 0 only
    w2, w0 = (load_causal_lm(tmp_path / d / "out")[0].state_dict() for d in ("two", "node0"))
    for k in w2:
        torch.testing.assert_close(w0[k], w2[k], rtol=1e-4, atol=1e-5)
    print(f"largest metric differences, two nodes vs two processes: {DIFFS}")


@pytest.mark.parametrize("rank, message", [
    (0, "machine_rank 1 of 2 did not arrive at 127.0.0.1:{port} within 5 s"),  # node 0 names the missing rank
    (1, "machine_rank 1 could not reach node 0 at 127.0.0.1:{port} .*within 5 s"),  # a follower names the endpoint
])
def test_a_node_alone_fails_within_the_timeout_naming_the_other(rank, message, tiny_tokenizer, tiny_policy):
    examples, cfg = _sft_data()
    port = _ports()
    node = _nodes(port, timeout=5)[rank]
    t0 = time.perf_counter()
    with pytest.raises(LaunchError, match=message.format(port=port)):
        train_supervised("sft", SFT_LOOP, node, tiny_policy, tiny_tokenizer, examples, cfg, Recorder(), launch_id="x")
    waited = time.perf_counter() - t0
    print(f"machine_rank {rank} alone failed after {waited:.1f} s (timeout 5 s)")
    assert 5 <= waited < 10


def test_nodes_meet_only_for_the_same_launch(tiny_tokenizer, tiny_policy):
    # Node 0 at one stage, the follower at another: node 0 names the missing rank, the follower says node 0 did not
    # open its launch; neither trains.
    examples, cfg = _sft_data()
    port = _ports()
    node0, node1 = _nodes(port, timeout=5)
    got = _in_threads(
        lambda: train_supervised("sft", SFT_LOOP, node0, tiny_policy, tiny_tokenizer, examples, cfg, Recorder(),
                                 launch_id="a"),
        lambda: train_supervised("sft", SFT_LOOP, node1, tiny_policy, tiny_tokenizer, examples, cfg, Recorder(),
                                 launch_id="b"))
    assert isinstance(got[0], LaunchError) and "machine_rank 1 of 2 did not arrive" in str(got[0])
    assert isinstance(got[1], LaunchError) and "node 0 did not open b" in str(got[1])


def _launcher_groups(workdir: Path) -> set[int]:
    """The process group of the launcher started in `workdir`: the processes, other than this one, that hold its
    stdout.log open (the launcher runs in a session of its own)."""
    pids = []
    for pid in filter(lambda p: p.isdigit() and int(p) != os.getpid(), os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(workdir / "stdout.log")
                   for fd in os.listdir(f"/proc/{pid}/fd")):
                pids.append(int(pid))
        except OSError:
            continue
    return {os.getpgid(pid) for pid in pids} - {os.getpgid(0)}


def _first_metrics(rec: Recorder, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not rec.of(Metrics):
        assert time.monotonic() < deadline, "no training step within the limit"
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_node_that_dies_mid_run_fails_node0_within_the_timeout(how, tmp_path, tiny_tokenizer, tiny_policy):
    # A follower killed mid-run (its sockets close: gloo notices at once) or frozen (SIGSTOP, as a machine that
    # hangs or drops off the network: only the process group's timeout ends node 0's wait).
    sft, rm = _models(tmp_path, tiny_tokenizer, tiny_policy)
    cfg = _config(iterations=200)
    timeout = 10
    node0, node1 = _nodes(_ports(), timeout=timeout)
    recs = [Recorder(), Recorder()]
    for r in (0, 1):
        (tmp_path / f"node{r}" / "work").mkdir(parents=True)
    out: dict[int, BaseException | None] = {}

    def node(r, resources):
        try:
            run_job(launched, _job(tmp_path / f"node{r}", cfg, sft, rm).to_dict(), resources,
                    tmp_path / f"node{r}" / "work", recs[r], mixed_precision="no", launch_id="ppo-die")
            out[r] = None
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out[r] = e

    threads = [threading.Thread(target=node, args=(r, n)) for r, n in ((0, node0), (1, node1))]
    for t in threads:
        t.start()
    _first_metrics(recs[0])  # both nodes are training
    follower = tmp_path / "node1" / "work"
    leaders = _launcher_groups(follower)
    assert leaders, "the follower's launcher was not found"
    t0 = time.perf_counter()
    for pgid in leaders:
        os.killpg(pgid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    threads[0].join(timeout=timeout * 30)  # far below the 30 min default that a hang would take
    failed_after = time.perf_counter() - t0
    for pgid in leaders:  # clean up the frozen follower
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    threads[1].join(timeout=60)
    print(f"follower {how}: node 0 failed after {failed_after:.1f} s (timeout {timeout} s)")
    assert not threads[0].is_alive(), f"node 0 still running {failed_after:.0f} s after its follower was {how}"
    assert isinstance(out[0], LaunchError), out[0]
    assert failed_after < timeout * 2.5


def test_a_multi_node_config_file_must_agree_with_resources():
    node0, _ = _nodes(29400)
    assert resolve_config(node0.model_copy(update={"accelerate_config": "ddp_multinode.yaml"})).name == \
        "ddp_multinode.yaml"
    with pytest.raises(ValueError, match="num_machines is 2 but resources.num_machines is 1"):
        resolve_config(ResourcesConfig(num_processes=2, accelerate_config="ddp_multinode.yaml"))


# The stages on a follower: `run_cached` with machine_rank 1 runs the build up to its launch, logging nothing, and then
# takes node 0's result from the shared MLflow store. Both "nodes" run in this process, so the per-machine key lock,
# which would make them take turns, is lifted. The session's Prefect server (`prefect_server`) is up before the two
# threads run flows at once: each would otherwise start its own and race for the port.

def _stage_flows(tmp_path, monkeypatch, node0_build):
    from prefect import flow

    from stages import base
    from stages.tracking import setup_mlflow

    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    monkeypatch.setattr(base, "key_lock", lambda stage, key: contextlib.nullcontext())
    follower_runs = []

    def follower_build(run, out_dir):
        follower_runs.append(run)
        run.log_metrics({"sft/truncated_prompts": 0}, step=0)  # dropped
        base.log_dataset(run, [{"a": 1}], "file:///x", "demo-sft", "training", "d" * 64)  # dropped
        raise FollowerDone("sft: trained with node 0")

    @flow
    def stage(exp_id: str, rank: int, timeout: float = 30):
        ctx = base.RunContext(experiment_id=exp_id, parent_run_id="", machine_rank=rank, rdzv_timeout_s=timeout)
        return base.run_cached(ctx, "sft", {"lr": 1.0}, {}, "data-fp", node0_build if rank == 0 else follower_build)[0]

    return setup_mlflow(), stage, follower_runs


def test_a_follower_trains_then_takes_node0s_result(tmp_path, monkeypatch, prefect_server):
    import mlflow
    from mlflow import MlflowClient

    from stages.follower import FollowerRun

    def node0_build(run, out_dir):
        time.sleep(3)  # node 0 trains and publishes while the follower waits
        (out_dir / "weights.txt").write_text("trained")

    exp_id, stage, follower_runs = _stage_flows(tmp_path, monkeypatch, node0_build)
    got = _in_threads(lambda: stage(exp_id, 1), lambda: (time.sleep(0.5), stage(exp_id, 0))[1])
    follower, node0 = got
    assert not isinstance(follower, BaseException), follower
    assert node0.status == "ran" and follower.status == "ran"  # both trained
    assert follower.mlflow_run_id == node0.mlflow_run_id and follower.digest == node0.digest
    assert follower.model_uri == node0.model_uri == "models:/rlhf-sft/1"
    assert [type(r) for r in follower_runs] == [FollowerRun]
    runs = mlflow.search_runs([exp_id], "tags.`rlhf.stage` = 'sft'", output_format="list")
    assert [r.info.run_id for r in runs] == [node0.mlflow_run_id]  # the follower logged no run
    assert len(MlflowClient().search_model_versions("name = 'rlhf-sft'")) == 1
    assert stage(exp_id, 1).status == "cached" and len(follower_runs) == 1  # later: a cache hit, as on node 0


def test_a_follower_fails_when_node0_fails_or_never_publishes(tmp_path, monkeypatch, prefect_server):
    def node0_build(run, out_dir):
        time.sleep(2)
        raise ValueError("bad row 3")

    exp_id, stage, _ = _stage_flows(tmp_path, monkeypatch, node0_build)
    got = _in_threads(lambda: stage(exp_id, 1), lambda: (time.sleep(0.5), stage(exp_id, 0))[1])
    assert isinstance(got[1], ValueError)
    assert isinstance(got[0], RuntimeError) and "node 0's run" in str(got[0]) and "failed" in str(got[0])
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"no finished run with cache key \w+ from node 0 in the MLflow store .*"
                                           r"resources.rdzv_timeout_s 2\)"):
        stage(exp_id, 1, timeout=2)
    assert time.perf_counter() - t0 < 10


@pytest.mark.slow
def test_two_rlhf_run_processes_train_as_two_nodes_and_only_node0_logs(tmp_path):
    """`rlhf run reward --preset micro` (two stages trained across nodes, one after the other) on two "nodes" (two processes, each its own state dir) sharing one MLflow store:
    both complete with the same stage runs, and each stage has one MLflow run and one model version, node 0's."""
    import json
    import subprocess
    import sys

    from mlflow import MlflowClient

    from stages.base import ARTIFACT_DIR

    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env |= {"MLFLOW_TRACKING_URI": uri}
    # The store is made first: two processes creating one SQLite store race in its migrations.
    (tmp_path / "shared").mkdir()
    subprocess.run([sys.executable, "-c", "from stages.tracking import setup_mlflow; setup_mlflow()"], check=True,
                   env=env | {"RLHF_HOME": str(tmp_path / "shared")})
    port = _ports()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "cli.main", "run", "reward", "--preset", "micro", "--json",
         "--set", "resources.device=cpu", "--set", "resources.num_machines=2", "--set", f"resources.machine_rank={r}",
         "--set", f"resources.rdzv_endpoint=127.0.0.1:{port}", "--set", "resources.rdzv_timeout_s=120"],
        env=env | {"RLHF_HOME": str(tmp_path / f"node{r}"), "PREFECT_HOME": str(tmp_path / f"prefect{r}")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    node0, node1 = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    for stage in ("data", "sft", "reward"):
        assert node1["stages"][stage]["mlflow_run_id"] == node0["stages"][stage]["mlflow_run_id"], stage
    assert [node1["stages"][s]["status"] for s in ("sft", "reward")] == ["ran"] * 2  # node 1 trained too
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("rlhf").experiment_id
    for stage in ARTIFACT_DIR:
        runs = client.search_runs([exp], f"tags.`rlhf.stage` = '{stage}'")
        assert len(runs) == (stage in node0["stages"]), stage  # one run per stage: node 0's
        assert all(r.info.status == "FINISHED" for r in runs)
    for name in ("rlhf-sft", "rlhf-reward"):
        assert len(client.search_model_versions(f"name = '{name}'")) == 1, name
    parents = client.search_runs([exp], "tags.`rlhf.pipeline` = 'reward'")
    assert [r.info.run_id for r in parents] == [node0["mlflow_run_id"]] and node1["mlflow_run_id"] == ""
