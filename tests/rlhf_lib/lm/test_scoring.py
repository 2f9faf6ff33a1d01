from __future__ import annotations

import torch

from rlhf_lib.lm.scoring import last_token_index, no_cache, position_ids, sequence_scores, token_values
from rlhf_lib.models import build_scalar_model


def test_position_ids_skip_left_padding():
    m = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids(m).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_last_token_index_left_and_right_padding():
    m = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    assert last_token_index(m).tolist() == [2, 4, 0]


def test_score_is_read_at_the_last_real_token_never_on_padding(tiny_policy):
    rm = build_scalar_model(tiny_policy, seed=0)
    torch.nn.init.normal_(rm.score.weight)
    ids = torch.tensor([[5, 6, 7, 8, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    base = sequence_scores(rm, ids, mask)
    junk = sequence_scores(rm, torch.tensor([[5, 6, 7, 8, 40, 41]]), mask)
    alone = sequence_scores(rm, ids[:, :4], mask[:, :4])
    torch.testing.assert_close(base, junk)
    torch.testing.assert_close(base, alone, atol=1e-5, rtol=1e-5)


def test_values_are_zero_on_padding_and_one_per_response_token(tiny_policy):
    vm = build_scalar_model(tiny_policy, seed=0)
    torch.nn.init.normal_(vm.score.weight)
    q = torch.tensor([[1, 5, 6], [7, 8, 9]])
    qm = torch.tensor([[0, 1, 1], [1, 1, 1]])
    r = torch.tensor([[10, 11, 1], [12, 1, 1]])
    rm = torch.tensor([[1, 1, 0], [1, 0, 0]])
    v = token_values(vm, q, qm, r, rm)
    assert v.shape == (2, 3)
    assert v[0, 2] == 0 and v[1, 1] == 0 and v[1, 2] == 0
    assert v[0, 0] != 0 and v[1, 0] != 0


def test_whole_sequence_passes_build_no_kv_cache(tiny_policy):
    """transformers 5 builds a KV cache by default; a scoring or training pass asks for none, with equal logits."""
    ids = torch.randint(3, 100, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        default = tiny_policy(input_ids=ids, attention_mask=mask)
        plain = tiny_policy(input_ids=ids, attention_mask=mask, **no_cache(tiny_policy))
    assert default.past_key_values is not None and plain.past_key_values is None
    assert torch.equal(default.logits, plain.logits)
    assert no_cache(tiny_policy.base_model) == {"use_cache": False}

    class NoKwargs(torch.nn.Module):
        def forward(self, input_ids):
            return input_ids

    assert no_cache(NoKwargs()) == {}  # a forward that cannot take the argument never gets it
