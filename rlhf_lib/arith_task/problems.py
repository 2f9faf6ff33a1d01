"""Problems of the arithmetic task: two-digit additions in the HH transcript format, and their train/eval split.

A prompt is `"\\n\\nHuman: What is 37 + 48?\\n\\nAssistant:"`, the demo task's transcript format, so the pipeline
reads both alike; the right answer is stored next to it (the prompt files' "answer" column) for the exact-match
reward.

The split is over operand RANGES: the tens digits (ta, tb) of the two operands name one of 81 blocks of 10 x 10
problems (30-39 + 60-69 is one block), and 9 blocks, a diagonal of the 9 x 9 square, are held out. Every tens
digit still appears in training in both places, with 8 of its 9 partners, so eval asks for range combinations the
model never saw, made of digits it knows; generalising needs the digit-wise algorithm, not a memorised table. The
split does not depend on the seed, so eval sets of different seeds are comparable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LOW, HIGH = 10, 99  # both operands have exactly two digits: one layout (2 + 2 digits) for a tiny model to learn
TENS = range(LOW // 10, HIGH // 10 + 1)  # 1..9
SHIFT = 3  # the held-out diagonal: see held_out_blocks
_PROMPT = "\n\nHuman: What is {a} + {b}?\n\nAssistant:"
_PARSE = re.compile(r"What is (\d+) \+ (\d+)\?")

Block = tuple[int, int]  # (tens digit of a, tens digit of b)


@dataclass(frozen=True, order=True)
class Problem:
    """`a + b`, both operands in [LOW, HIGH]."""

    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def block(self) -> Block:
        return (self.a // 10, self.b // 10)

    @property
    def carries(self) -> bool:
        """Whether the units column carries into the tens (the step a tiny model gets wrong most)."""
        return self.a % 10 + self.b % 10 >= 10

    @property
    def prompt(self) -> str:
        return _PROMPT.format(a=self.a, b=self.b)


def held_out_blocks() -> frozenset[Block]:
    """The 9 of 81 operand-range blocks (11%) reserved for eval: tb = ta + 3, cyclically over the tens digits 1..9.

    (1, 4), (2, 5), ..., (6, 9), (7, 1), (8, 2), (9, 3): one block per row and per column (a Latin-square diagonal),
    so every tens digit is held out once as the first operand's and once as the second's, and keeps 8 partners in
    training either way. Every tens-digit sum of a held-out block (5..15) also comes from training blocks, so the
    answers' hundreds and tens digits follow patterns seen in training; the unshifted diagonal would hold out
    (9, 9), the only block whose answers reach 189-198. A held-out block's mirror (4, 1) is trained on: the same
    sums, asked in the other order, which a model does not know to be the same question.
    """
    return frozenset((ta, (ta - 1 + SHIFT) % len(TENS) + 1) for ta in TENS)


def problems(held_out: bool) -> list[Problem]:
    """Every problem of the held-out blocks (`held_out=True`, 900) or of the training blocks (7,200), sorted."""
    blocks = held_out_blocks()
    return [Problem(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)
            if ((a // 10, b // 10) in blocks) == held_out]


def parse_problem(prompt: str) -> Problem | None:
    """The problem of an arithmetic prompt, or None for any other text."""
    m = _PARSE.search(prompt)
    if m is None:
        return None
    return Problem(int(m.group(1)), int(m.group(2)))
