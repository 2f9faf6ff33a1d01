"""Problems of the arithmetic task: two-digit additions in the HH transcript format, and their train/eval split.

A prompt is `"\\n\\nHuman: What is 37 + 48?\\n\\nAssistant:"`, the demo task's transcript format, so the pipeline
reads both alike; the right answer is stored next to it (the prompt files' "answer" column) for the exact-match
reward.

The split is over operand RANGES: the tens digits (ta, tb) of the two operands name one of 81 blocks of 10 x 10
problems (30-39 + 60-69 is one block), and 18 blocks are held out: the diagonal tb = ta + 3 (cyclically) and its
mirror ta = tb + 3, so a held-out problem's twin in the other order (48 + 37 for 37 + 48) is held out with it. Every
tens digit still appears in training in both places, with 7 of its 9 partners, so eval asks for range combinations the
model never saw, made of digits it knows; generalising needs the digit-wise algorithm, not a memorised table. The
split does not depend on the seed, so eval sets of different seeds are comparable.

`data.operands` "2+1" asks a two-digit number plus a one-digit one ("What is 47 + 6?", for a pretrained model that
reads the prompt through its chat template): a block is (tens digit of a, b), 81 blocks of 10 problems, and three
diagonals (27 blocks, 270 problems) are held out so that eval has as many distinct problems to ask (no problem has a
twin: the one-digit operand never comes first). "1+1" asks two one-digit numbers ("What is 7 + 8?", where
SmolLM2-135M-Instruct starts between 0.1 and 0.6): a block is one problem (a, b); the unordered pairs {a, a + 3}
(both orders) and every problem whose sum is 10 (a band of sums training never answers) are held out, 25 of 81.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LOW, HIGH = 10, 99  # both operands have exactly two digits: one layout (2 + 2 digits) for a tiny model to learn
TENS = range(LOW // 10, HIGH // 10 + 1)  # 1..9
SHIFT = 3  # the held-out diagonal: see held_out_blocks
# data.operands -> (range of a, range of b, the diagonals held out as shifts of tb against ta, the sums held out).
# Where a and b share a range every held-out diagonal comes with its mirror (shift 9 - s), so no held-out problem's
# twin in the other order is trained on.
OPERANDS: dict[str, tuple[range, range, tuple[int, ...], frozenset[int]]] = {
    "2+2": (range(LOW, HIGH + 1), range(LOW, HIGH + 1), (SHIFT, len(TENS) - SHIFT), frozenset()),
    "2+1": (range(LOW, HIGH + 1), range(1, 10), (SHIFT, 5, 7), frozenset()),
    "1+1": (range(1, 10), range(1, 10), (SHIFT, len(TENS) - SHIFT), frozenset({10})),
}
_PROMPT = "\n\nHuman: What is {a} + {b}?\n\nAssistant:"
_PARSE = re.compile(r"What is (\d+) \+ (\d+)\?")
_QUESTION = re.compile(r"What is \d+(?: [+-] \d+){1,3}\?")  # a plain problem's or a chain's (chains.py)

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
    """The operand-range blocks reserved for eval ("2+2": 18 of 81): tb = ta + 3 cyclically over the tens digits
    1..9, and its mirror tb = ta + 6 (= ta - 3).

    (1, 4), (2, 5), ..., (7, 1), (8, 2), (9, 3) and (4, 1), (5, 2), ..., (3, 9): two blocks per row and per column,
    so every tens digit is held out twice as the first operand's and twice as the second's, and keeps 7 partners in
    training either way. A held-out block's mirror is held out too: the same sums asked in the other order are not
    a twin the model trained on. Every tens-digit sum of a held-out block (5..15) also comes from training blocks, so
    the answers' hundreds and tens digits follow patterns seen in training; the unshifted diagonal would hold out
    (9, 9), the only block whose answers reach 189-198.
    """
    return frozenset((ta, (ta - 1 + shift) % len(TENS) + 1) for shift in OPERANDS[operands][2] for ta in TENS)


def held_out(problem: Problem, operands: str = "2+2") -> bool:
    """Whether `problem` is an eval problem: its block is held out, or its sum is in the held-out band."""
    return problem.block in held_out_blocks(operands) or problem.answer in OPERANDS[operands][3]


def problems(evaluation: bool, operands: str = "2+2") -> list[Problem]:
    """Every eval problem (`evaluation=True`; "2+2": 1,800, "2+1": 270, "1+1": 25) or every training problem
    ("2+2": 6,300, "2+1": 540, "1+1": 56), sorted: `held_out` splits them."""
    a_range, b_range, _, _ = OPERANDS[operands]
    return [p for a in a_range for b in b_range if held_out(p := Problem(a, b), operands) == evaluation]


def with_instruction(prompt: str, instruction: str | None) -> str:
    """`prompt` with `instruction` after its question ("What is 7 + 8? Answer with the number only."); unchanged
    when `instruction` is None or the text holds no question."""
    if not instruction:
        return prompt
    return _QUESTION.sub(lambda m: f"{m.group(0)} {instruction}", prompt, count=1)


def parse_problem(prompt: str) -> Problem | None:
    """The problem of an arithmetic prompt, or None for any other text."""
    m = _PARSE.search(prompt)
    if m is None:
        return None
    return Problem(int(m.group(1)), int(m.group(2)))
