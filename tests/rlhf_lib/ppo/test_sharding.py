"""The pieces of multi-process PPO that need no process group: row-sharded sampling and the size checks.
(The launched group itself is tested against one process in tests/stages/test_ppo_loop.py.)"""

from __future__ import annotations

import pytest
import torch

from rlhf_lib.config import PPOConfig
from rlhf_lib.distributed import ProcessGroup, RowShard
from rlhf_lib.lm.generation import encode_prompts, sample
from rlhf_lib.ppo.sharding import check_sizes


def test_each_shard_samples_the_tokens_of_one_process_and_steps_the_generator_alike(tiny_tokenizer, tiny_policy):
    # 6 rows over 3 processes (rows 0-1, 2-3, 4-5), fixed-length sampling so no process group is needed.
    prompts = [f"\n\nHuman: question {i}\n\nAssistant:" for i in range(6)]
    query, query_mask = encode_prompts(tiny_tokenizer, prompts, 16)
    kw = dict(max_new_tokens=5, temperature=0.7, eos_token_id=tiny_tokenizer.eos_token_id,
              pad_token_id=tiny_tokenizer.pad_token_id, stop_at_eos=False)
    one = torch.Generator().manual_seed(7)
    expected = sample(tiny_policy, query, query_mask, generator=one, **kw)
    for start in (0, 2, 4):
        gen = torch.Generator().manual_seed(7)
        rows = slice(start, start + 2)
        got = sample(tiny_policy, query[rows], query_mask[rows], generator=gen,
                     shard=RowShard(start, 6, group=ProcessGroup(device="cpu")), **kw)
        assert torch.equal(got[0], expected[0][rows])
        torch.testing.assert_close(got[2], expected[2][rows], atol=1e-5, rtol=1e-5)
        assert torch.equal(gen.get_state(), one.get_state())


@pytest.mark.parametrize(("update", "message"), [
    (dict(batch_size=8, minibatches=2, gradient_accumulation_steps=4),
     r"minibatch \(ppo.batch_size / ppo.minibatches = 4 rows\).*divisible by 8"),
    (dict(rm_offset_samples=5), r"ppo.rm_offset_samples \(5\) must be divisible by resources.num_processes \(2\)"),
    (dict(ptx_coef=0.1, ptx_batch_size=3), r"ppo.ptx_batch_size \(3\)"),
    (dict(rollout_engine="vllm"), r"ppo.rollout_engine=vllm runs in one process only"),
])
def test_sizes_two_processes_cannot_split_are_refused_by_key(update, message):
    cfg = PPOConfig(batch_size=8, minibatches=2, rm_offset_samples=8).model_copy(update=update)
    check_sizes(cfg, 1)  # one process splits nothing
    with pytest.raises(ValueError, match=message):
        check_sizes(cfg, 2)


def test_a_config_that_splits_evenly_passes():
    check_sizes(PPOConfig(batch_size=8, minibatches=2, gradient_accumulation_steps=2, rm_offset_samples=8), 2)
