"""Problems of the arithmetic task: two-digit additions in the HH transcript format, and their train/eval split.

A prompt is `"\\n\\nHuman: What is 37 + 48?\\n\\nAssistant:"`, the demo task's transcript format, so the pipeline
reads both alike; the right answer is stored next to it (the prompt files' "answer" column) for the exact-match
reward.

The split is over operand RANGES: the tens digits (ta, tb) of the two operands name one of 81 blocks of 10 x 10
problems (30-39 + 60-69 is one block), and 9 blocks, a diagonal of the 9 x 9 square, are held out. Every tens
digit still appears in training in both places, with 8 of its 9 partners, so eval asks for range combinations the
model never saw, made of digits it knows; generalising needs the digit-wise algorithm, not a memorised table. The
split does not depend on the seed, so eval sets of different seeds are comparable.

`data.operands` "2+1" asks a two-digit number plus a one-digit one ("What is 47 + 6?", for a pretrained model that
reads the prompt through its chat template): a block is (tens digit of a, b), 81 blocks of 10 problems, and three
diagonals (27 blocks, 270 problems) are held out so that eval has as many distinct problems to ask. "1+1" asks two
one-digit numbers ("What is 7 + 8?", where SmolLM2-135M-Instruct starts between 0.1 and 0.6): a block is one problem
(a, b), and the same three diagonals hold out 27 of the 81.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LOW, HIGH = 10, 99  # both operands have exactly two digits: one layout (2 + 2 digits) for a tiny model to learn
TENS = range(LOW // 10, HIGH // 10 + 1)  # 1..9
SHIFT = 3  # the held-out diagonal: see held_out_blocks
# data.operands -> (range of a, range of b, the diagonals held out, as shifts of tb against ta)
OPERANDS: dict[str, tuple[range, range, tuple[int, ...]]] = {
    "2+2": (range(LOW, HIGH + 1), range(LOW, HIGH + 1), (SHIFT,)),
    "2+1": (range(LOW, HIGH + 1), range(1, 10), (SHIFT, 5, 7)),
    "1+1": (range(1, 10), range(1, 10), (SHIFT, 5, 7)),
}
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
        """(ta, tb): a two-digit operand's tens digit, a one-digit operand itself."""
        return (self.a // 10 or self.a, self.b // 10 or self.b)

    @property
    def carries(self) -> bool:
        """Whether the units column carries into the tens (the step a tiny model gets wrong most)."""
        return self.a % 10 + self.b % 10 >= 10

    @property
    def prompt(self) -> str:
        return _PROMPT.format(a=self.a, b=self.b)


def held_out_blocks(operands: str = "2+2") -> frozenset[Block]:
    """The 9 of 81 operand-range blocks (11%) reserved for eval: tb = ta + 3, cyclically over the tens digits 1..9.

    (1, 4), (2, 5), ..., (6, 9), (7, 1), (8, 2), (9, 3): one block per row and per column (a Latin-square diagonal),
    so every tens digit is held out once as the first operand's and once as the second's, and keeps 8 partners in
    training either way. Every tens-digit sum of a held-out block (5..15) also comes from training blocks, so the
    answers' hundreds and tens digits follow patterns seen in training; the unshifted diagonal would hold out
    (9, 9), the only block whose answers reach 189-198. A held-out block's mirror (4, 1) is trained on: the same
    sums, asked in the other order, which a model does not know to be the same question.
    """
    return frozenset((ta, (ta - 1 + shift) % len(TENS) + 1) for shift in OPERANDS[operands][2] for ta in TENS)


def problems(held_out: bool, operands: str = "2+2") -> list[Problem]:
    """Every problem of the held-out blocks (`held_out=True`; "2+2": 900, "2+1": 270, "1+1": 27) or of the training
    blocks ("2+2": 7,200, "2+1": 540, "1+1": 54), sorted."""
    blocks = held_out_blocks(operands)
    a_range, b_range, _ = OPERANDS[operands]
    return [p for a in a_range for b in b_range if ((p := Problem(a, b)).block in blocks) == held_out]


def with_instruction(prompt: str, instruction: str | None) -> str:
    """`prompt` with `instruction` after its question ("What is 7 + 8? Answer with the number only."); unchanged
    when `instruction` is None or the text holds no question."""
    if not instruction:
        return prompt
    return _PARSE.sub(lambda m: f"{m.group(0)} {instruction}", prompt, count=1)


def parse_problem(prompt: str) -> Problem | None:
    """The problem of an arithmetic prompt, or None for any other text."""
    m = _PARSE.search(prompt)
    if m is None:
        return None
    return Problem(int(m.group(1)), int(m.group(2)))
