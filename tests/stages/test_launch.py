"""SFT and RM under `accelerate launch` with 2 CPU processes (gloo) match one process on the same global batches."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhf_lib.config import ResourcesConfig, RewardConfig, SFTConfig
from rlhf_lib.data.records import RankedExample, SFTExample
from rlhf_lib.events import Metrics, Recorder
from rlhf_lib.models import build_scalar_model
from stages.launch import LaunchError, resolve_config, root_cause
from stages.reward import REWARD_LOOP
from stages.sft import SFT_LOOP
from stages.supervised import numerics_section, train_supervised

LOOPS = {"sft": SFT_LOOP, "reward": REWARD_LOOP}

TWO = ResourcesConfig(num_processes=2, accelerate_config="cpu_gloo.yaml")


def _sft_data():
    # 17 rows in batches of 8: the last batch has 1 row, so the second process trains on a stand-in with weight 0.
    return [SFTExample(f"\n\nHuman: tell me about topic {i}\n\nAssistant:", " Sure, topic 1 is nice." + " Thanks!" * (i % 3))
            for i in range(17)], SFTConfig(epochs=2, batch_size=8, max_length=48, lr=3e-3)


def _rm_data():
    # Lists of different K (3 and 2): the per-list mean must still weigh each list the same across processes.
    rows = [RankedExample(f"\n\nHuman: topic {i}\n\nAssistant:", (" Sure, topic 1 is nice. Thanks!", " Sure.", " no")
                          [: 3 if i % 2 else 2]) for i in range(9)]
    return rows, RewardConfig(epochs=2, batch_size=4, max_length=48, lr=3e-3)


@pytest.mark.parametrize("kind", ["sft", "reward"])
@pytest.mark.parametrize("micro_batch_tokens", [None, 40])
def test_two_gloo_processes_match_one(kind, micro_batch_tokens, tiny_tokenizer, tiny_policy):
    # With a token budget each process runs several forwards before its one backward (DDP syncs the gradient once).
    model = tiny_policy if kind == "sft" else build_scalar_model(tiny_policy, seed=0)
    examples, cfg = _sft_data() if kind == "sft" else _rm_data()
    cfg = cfg.model_copy(update={"micro_batch_tokens": micro_batch_tokens})
    rec1, rec2 = Recorder(), Recorder()
    m1, f1 = train_supervised(kind, LOOPS[kind], ResourcesConfig(), copy.deepcopy(model), tiny_tokenizer, examples, cfg,
                              rec1)
    m2, f2 = train_supervised(kind, LOOPS[kind], TWO, copy.deepcopy(model), tiny_tokenizer, examples, cfg, rec2)
    one = [(e.step, e.values) for e in rec1.of(Metrics)]
    two = [(e.step, e.values) for e in rec2.of(Metrics)]
    assert [s for s, _ in one] == [s for s, _ in two] == list(range(int(f1[f"{kind}/steps"])))
    loss = f"{kind}/loss"
    for (_, a), (_, b) in zip(one, two):  # the same loss curve, step by step
        assert b[loss] == pytest.approx(a[loss], rel=1e-5, abs=1e-6)
        assert b[f"{kind}/grad_norm"] == pytest.approx(a[f"{kind}/grad_norm"], rel=1e-4, abs=1e-6)
    if kind == "reward":
        assert [m["reward/train_accuracy"] for _, m in two] == pytest.approx([m["reward/train_accuracy"] for _, m in one])
    assert f2 == pytest.approx(f1, rel=1e-5)
    start, w1, w2 = model.state_dict(), m1.state_dict(), m2.state_dict()
    assert any(not torch.equal(start[k], w1[k]) for k in w1)  # it trained
    # The same final weights. With a budget each process sorts and splits its own half of the batch, so the sums run
    # in another order than one process's; after 6 Adam steps a near-zero element differed by 1.9e-5 (measured).
    atol = 1e-5 if micro_batch_tokens is None else 5e-5
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=atol)


def test_a_failing_worker_raises_with_its_stderr(tiny_tokenizer, tiny_policy):
    # A ranked list with one response has no pair: the workers fail inside the training loop.
    bad = [RankedExample("\n\nHuman: hi\n\nAssistant:", (" Sure.",))] * 2
    rm = build_scalar_model(tiny_policy, seed=0)
    with pytest.raises(LaunchError, match=r"exited with \d+: \[rank\d\]: RuntimeError: max\(\)"):
        train_supervised("reward", REWARD_LOOP, TWO, rm, tiny_tokenizer, bad, RewardConfig(batch_size=2), Recorder())


def test_root_cause_is_the_first_worker_exception():
    lines = ["[rank1]: Traceback (most recent call last):", "[rank1]: ValueError: bad row 3",
             "[rank0]: ValueError: bad row 1", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    assert root_cause(lines) == "[rank1]: ValueError: bad row 3"
    assert root_cause(["ImportError: DeepSpeed is not installed"]) == "ImportError: DeepSpeed is not installed"


def test_configs_are_found_and_a_multi_node_one_needs_as_many_machines(tmp_path):
    assert resolve_config(TWO).name == "cpu_gloo.yaml"
    with pytest.raises(FileNotFoundError, match="resources.accelerate_config: no file 'nope.yaml'"):
        resolve_config(ResourcesConfig(num_processes=2, accelerate_config="nope.yaml"))
    # A two-machine file with resources for one would have each node train alone: refused, naming both counts.
    with pytest.raises(ValueError, match="num_machines is 2 but resources.num_machines is 1"):
        resolve_config(ResourcesConfig(num_processes=2, accelerate_config="ddp_multinode.yaml"))
    nodes = dict(num_machines=2, machine_rank=1, rdzv_endpoint="10.0.0.1:29400")
    for name in ("ddp_multinode.yaml", "cpu_gloo.yaml"):  # placement comes from resources, so one-machine files do
        assert resolve_config(ResourcesConfig(accelerate_config=name, **nodes)).name == name


def test_only_mixed_precision_enters_the_cache_key():
    assert numerics_section(TWO) == {} == numerics_section(ResourcesConfig(gradient_checkpointing=True))
    assert numerics_section(ResourcesConfig(mixed_precision="bf16")) == {"resources": {"mixed_precision": "bf16"}}
