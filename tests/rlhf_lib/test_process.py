"""Process-wide settings."""

from __future__ import annotations

import torch

from rlhf_lib.process import configure_process


def test_configure_process_sets_the_threads():
    before = torch.get_num_threads()
    try:
        configure_process(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
