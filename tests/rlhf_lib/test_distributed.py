"""The process group and the supervised stages' batch splitting, with one process (the launched group is tested
against one process in tests/stages/test_launch.py and tests/stages/test_ppo_loop.py)."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lib.distributed import ProcessGroup
from rlhf_lib.training import SupervisedRun, global_share, shard, share_factor, weighted_mean


def test_shard_is_contiguous_and_covers_the_batch_once():
    # B=5 on 2 processes: ceil(5/2)=3 -> [0,1,2] and [3,4]; B=8 on 3: [0,1,2] [3,4,5] [6,7].
    assert [shard(list(range(5)), r, 2) for r in range(2)] == [([0, 1, 2], True), ([3, 4], True)]
    assert [shard(list(range(8)), r, 3)[0] for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_a_process_left_without_items_gets_a_stand_in_that_does_not_count():
    # The last batch of an epoch can be shorter than the number of processes: B=1 on 2 processes.
    assert shard(["a"], 0, 2) == (["a"], True)
    assert shard(["a"], 1, 2) == (["a"], False)


def test_shares_average_to_the_global_mean():
    # Process 0 holds 3 tokens with mean 2.0, process 1 holds 1 token with mean 6.0: global mean (3*2 + 6)/4 = 3.
    # Shares: 2*3/4 * 2.0 = 3.0 and 2*1/4 * 6.0 = 3.0; DDP averages them: (3 + 3)/2 = 3.
    shares = [share_factor(3, 4, 2) * 2.0, share_factor(1, 4, 2) * 6.0]
    assert sum(shares) / 2 == 3.0
    assert share_factor(5, 5, 1) == 1.0  # one process: the local mean unchanged


def test_one_process_is_plain_pytorch():
    group = ProcessGroup()
    assert (group.rank, group.world, group.is_main) == (0, 1, True)
    loss = torch.tensor(1.5)
    share, total = global_share(group, loss, 7.0, torch.zeros(2))
    assert share is loss and total == 7.0
    assert weighted_mean(group, {"accuracy": 0.25}, 4) == {"accuracy": 0.25}
    assert group.sum([1, 2.5]) == [1.0, 2.5] and group.max([3]) == [3]
    x = torch.arange(4).reshape(2, 2)
    assert group.gather(x) is x and group.gather_objects("a") == ["a"] and group.broadcast(True) is True


def test_a_non_finite_loss_is_refused_before_touching_the_weights(tiny_policy):
    run = SupervisedRun(ProcessGroup(), tiny_policy, torch.optim.AdamW(tiny_policy.parameters(), lr=1.0))
    before = [p.detach().clone() for p in run.model.parameters()]
    logits = run.model(input_ids=torch.tensor([[1, 2, 3]])).logits
    with pytest.raises(FloatingPointError, match="SFT loss is nan at step 3"):
        run.step(logits.sum() * math.nan, None, 1.0, "SFT", 3)
    assert all(torch.equal(a, b) for a, b in zip(before, run.model.parameters()))


def test_fp16_without_a_gpu_names_the_key():
    if torch.cuda.is_available():
        pytest.skip("fp16 is allowed with a GPU")
    with pytest.raises(ValueError, match="resources.mixed_precision=fp16 needs a CUDA GPU"):
        ProcessGroup("fp16")


def test_bf16_and_gradient_checkpointing_train_in_one_process(tiny_tokenizer, tiny_policy):
    # A process may train one stage in fp32 and the next in bf16: Accelerate's process-wide state is reset.
    from rlhf_lib.config import SFTConfig
    from rlhf_lib.data.records import SFTExample
    from rlhf_lib.sft import train_sft

    ProcessGroup("no")
    ex = [SFTExample("\n\nHuman: hi\n\nAssistant:", " Sure, topic 1 is nice.")] * 4
    final, _ = train_sft(tiny_policy, tiny_tokenizer, ex, SFTConfig(epochs=1, batch_size=2, max_length=32),
                         group=ProcessGroup("bf16"), gradient_checkpointing=True)
    assert math.isfinite(final["sft/final_loss_ema"]) and final["sft/steps"] == 2
    assert not tiny_policy.training
    assert not getattr(tiny_policy, "is_activation_checkpointing", tiny_policy.is_gradient_checkpointing)
    assert not hasattr(tiny_policy, "_original_forward")  # the autocast wrapper is gone after training


def test_prepare_turns_on_checkpointing_and_autocast(tiny_policy):
    run = SupervisedRun(ProcessGroup("bf16"), tiny_policy, torch.optim.AdamW(tiny_policy.parameters()),
                        gradient_checkpointing=True)
    assert getattr(run.model, "is_activation_checkpointing", None) or run.model.is_gradient_checkpointing
    assert hasattr(run.model, "_original_forward")  # Accelerate's autocast forward


class _Acc:
    ended = 0

    def end_training(self):
        self.ended += 1


def test_close_keeps_a_launched_group_alive_and_ends_an_in_process_one(monkeypatch):
    from rlhf_lib import distributed

    monkeypatch.setattr(distributed, "_KEPT_UNTIL_EXIT", [])
    group = ProcessGroup()
    group._acc = acc = _Acc()
    group.close()  # one process that prepared models: Accelerate's usual end
    assert acc.ended == 1 and distributed._KEPT_UNTIL_EXIT == []
    monkeypatch.setenv("LOCAL_RANK", "0")  # as under `accelerate launch`
    group.close()  # nothing is freed or torn down: the launched worker leaves with os._exit
    assert acc.ended == 1 and distributed._KEPT_UNTIL_EXIT == [group]


def test_shards_parameters_under_fsdp_and_zero3_only():
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    def group(kind, zero_stage=None):
        g = ProcessGroup()
        plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
        g._acc = SimpleNamespace(distributed_type=kind, state=SimpleNamespace(deepspeed_plugin=plugin))
        return g

    assert not ProcessGroup().shards_parameters  # one process, nothing prepared
    assert group(DistributedType.FSDP).shards_parameters
    assert group(DistributedType.DEEPSPEED, 3).shards_parameters
    assert not group(DistributedType.DEEPSPEED, 2).shards_parameters
    assert not group(DistributedType.MULTI_CPU).shards_parameters
