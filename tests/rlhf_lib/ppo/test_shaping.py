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
