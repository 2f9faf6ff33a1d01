"""Reward shaping before the KL penalty: EOS truncation, running moments, offset, EOS penalty, clip."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_lib.ppo.shaping import RunningMoments, shape_scores, truncate_after_eos

EOS, PAD = 9, 0


def test_truncate_after_eos_masks_everything_after_the_first_eos():
    response = torch.tensor([[5, 9, 7, 9], [5, 6, 7, 8], [9, 5, 6, 7]])
    mask = torch.ones(3, 4, dtype=torch.long)
    logp = torch.full((3, 4), -1.0)
    r, m, lp = truncate_after_eos(response, mask, logp, EOS, PAD)
    # Row 0: EOS at 1 stays real, 7 and the 2nd EOS go; row 1: no EOS, untouched; row 2: only the EOS stays.
    assert m.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert r.tolist() == [[5, 9, 0, 0], [5, 6, 7, 8], [9, 0, 0, 0]]
    assert lp.tolist() == [[-1, -1, 0, 0], [-1, -1, -1, -1], [-1, 0, 0, 0]]


def test_truncate_keeps_padding_padding():
    response = torch.tensor([[5, 6, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 0]])
    _, m, _ = truncate_after_eos(response, mask, torch.zeros(1, 4), EOS, PAD)
    assert m.tolist() == [[1, 1, 0, 0]]


def test_running_moments_match_the_whole_sample():
    data = torch.tensor([1.0, 2.0, 4.0, 7.0, 11.0, -3.0, 0.5])
    rm = RunningMoments()
    for chunk in (data[:2], data[2:3], data[3:]):
        rm.update(chunk)
    assert rm.count == 7
    assert rm.mean == pytest.approx(float(data.mean()))
    assert rm.var == pytest.approx(float(data.var(unbiased=False)))
    clone = RunningMoments()
    clone.load_state_dict(rm.state_dict())
    assert clone.state_dict() == rm.state_dict()


def test_shape_scores_offset_and_missing_eos_penalty():
    raw = torch.tensor([1.0, 2.0, 3.0])
    has_eos = torch.tensor([True, False, True])
    s, stats = shape_scores(raw, has_eos, offset=2.0, missing_eos_penalty=1.0)
    # 1-2 = -1; 2-2-1 = -1; 3-2 = 1.
    assert s.tolist() == [-1.0, -1.0, 1.0]
    assert stats["score_clipfrac"] == 0.0


def test_shape_scores_unit_std_scales_before_the_eos_penalty():
    # (raw - 2) / 0.5, then the penalty in the scaled units: (1-2)/0.5 = -2; (2-2)/0.5 - 1 = -1; (3-2)/0.5 = 2.
    s, _ = shape_scores(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True]), offset=2.0, scale=0.5,
                        missing_eos_penalty=1.0)
    assert s.tolist() == [-2.0, -1.0, 2.0]


def test_shape_scores_whitening_uses_the_running_statistics():
    moments = RunningMoments()
    s, _ = shape_scores(torch.tensor([1.0, 3.0]), torch.tensor([True, True]), moments=moments)
    # mean 2, biased var 1: whitened to -1, +1.
    assert s.tolist() == pytest.approx([-1.0, 1.0], abs=1e-6)
    s, _ = shape_scores(torch.tensor([2.0, 2.0]), torch.tensor([True, True]), moments=moments)
    # After 4 samples {1, 3, 2, 2}: mean 2, var 0.5; 2 -> 0.
    assert moments.var == pytest.approx(0.5)
    assert s.tolist() == pytest.approx([0.0, 0.0], abs=1e-6)


def test_shape_scores_clip_counts_what_it_changed():
    s, stats = shape_scores(torch.tensor([-5.0, 0.5, 5.0, 1.0]), torch.ones(4, dtype=torch.bool), clip=1.0)
    assert s.tolist() == [-1.0, 0.5, 1.0, 1.0]
    assert stats["score_clipfrac"] == 0.5
    assert all(math.isfinite(v) for v in s.tolist())


def test_the_zero_reward_control_keeps_only_the_shaping():
    """ppo.reward_control=zero_reward: every normalised score is 0 (the SFT samples' mean after the offset), then the
    missing-EOS penalty acts as in the real run: raw [1, 2, 3], offset 2 -> 0, 0 - 1, 0."""
    raw, has_eos = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True])
    s, _ = shape_scores(raw, has_eos, offset=2.0, missing_eos_penalty=1.0, control="zero_reward")
    assert s.tolist() == [0.0, -1.0, 0.0]
    s, _ = shape_scores(raw, has_eos, offset=2.0, control="zero_reward")
    assert s.tolist() == [0.0, 0.0, 0.0]


def test_the_shuffled_reward_control_permutes_the_normalised_scores_before_the_penalty():
    """shuffled_reward: (raw - offset) / scale permuted by the seeded permutation, then the EOS penalty on the rows
    that have no EOS (the penalty stays with its reply). raw [1, 2, 3, 4], offset 1 -> [0, 1, 2, 3]."""
    from rlhf_lib.ppo.shaping import control_seed, controlled

    raw, has_eos = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([True, False, True, True])
    seed = control_seed(0, 3)
    perm = torch.randperm(4, generator=torch.Generator().manual_seed(seed)).tolist()
    s, _ = shape_scores(raw, has_eos, offset=1.0, missing_eos_penalty=0.5, control="shuffled_reward",
                        permutation_seed=seed)
    expected = [float(perm[i]) - (0.5 if i == 1 else 0.0) for i in range(4)]
    assert s.tolist() == expected
    again, _ = shape_scores(raw, has_eos, offset=1.0, missing_eos_penalty=0.5, control="shuffled_reward",
                            permutation_seed=seed)
    assert again.tolist() == expected  # a resumed run and every process draw the same permutation
    assert sorted(controlled(torch.tensor([0.0, 1.0, 2.0, 3.0]), "shuffled_reward", seed).tolist()) == [0, 1, 2, 3]
    # Different iterations draw different permutations (for some iteration of the first few).
    assert len({tuple(controlled(torch.arange(8.0), "shuffled_reward", control_seed(0, i)).tolist())
                for i in range(5)}) > 1
    assert control_seed(0, 3) != control_seed(1, 3)


def test_no_control_is_the_identity_and_an_unknown_one_is_refused():
    from rlhf_lib.ppo.shaping import controlled

    x = torch.tensor([0.3, -1.0])
    assert controlled(x, "none") is x
    with pytest.raises(ValueError, match="unknown reward control 'flip'"):
        controlled(x, "flip")
