"""The prompt sampler of the PPO loop: endless seeded passes over the training prompts."""

from __future__ import annotations

import random
from collections.abc import Sequence


class PromptSampler:
    """Endless seeded passes over the prompts, each in a fresh order; its position is part of the state."""

    def __init__(self, prompts: Sequence[str], seed: int):
        if not prompts:
            raise ValueError("PPO needs at least one prompt")
        self.prompts = list(prompts)
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.pos = 0

    def next(self, n: int) -> list[str]:
        out = []
        while len(out) < n:
            if self.pos >= len(self.order):
                self.order = list(range(len(self.prompts)))
                self.rng.shuffle(self.order)
                self.pos = 0
            out.append(self.prompts[self.order[self.pos]])
            self.pos += 1
        return out
