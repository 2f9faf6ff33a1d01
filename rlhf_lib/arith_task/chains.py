"""Chained arithmetic for a calculator that does one operation a call (`data.operands: chain`, issue 54 item 4).

A problem is two to four two-digit numbers joined by + and -, evaluated left to right: "What is 37 + 48 - 29?" needs
two calls of the one-operation calculator (`rlhf_lib.envs.calculator:OneOpCalculatorEnv`), `37 + 48` then `85 - 29`,
and the answer 56. The policy chooses every call's operands: the first two numbers, then the last result and the next
number. Subtraction is only drawn where the running value stays >= 0, so every intermediate result is a plain
integer of one to three digits.

The demonstrations are right, call by call, but cover only a share of the training problems of each number of
calls (`data.sft_call_shares`; the `arithmetic-chain` preset demonstrates every one- and two-call problem and one
three-call problem in twenty); PPO's prompts and the eval ask one, two and three calls in equal shares, so the
three-call problems are where the start is weak and RL has room.

The split is over the multiset of the numbers' tens digits, hashed: a sixth of the multisets is the test split, a
sixth the validation split (`data.heldout: validation`, for choosing settings), the rest training. The same numbers
in any order and with any signs land in the same split, so no held-out problem, nor any reordering of it, is trained
on. It does not depend on the seed.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .problems import HIGH, LOW

MAX_CALLS = 3
_CHAIN = re.compile(r"What is (\d+(?: [+-] \d+){1,%d})\?" % MAX_CALLS)
_TERM = re.compile(r"([+-]) (\d+)")


@dataclass(frozen=True, order=True)
class Chain:
    """`numbers[0] ops[0] numbers[1] ops[1] ...`, left to right; len(ops) == len(numbers) - 1 calls."""

    numbers: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def calls(self) -> int:
        """Calls of the one-operation calculator the problem needs."""
        return len(self.ops)

    def steps(self) -> list[tuple[int, str, int, int]]:
        """Each call as (left, op, right, result): the first two numbers, then each result with the next number."""
        out, value = [], self.numbers[0]
        for op, b in zip(self.ops, self.numbers[1:]):
            result = value + b if op == "+" else value - b
            out.append((value, op, b, result))
            value = result
        return out

    @property
    def answer(self) -> int:
        return self.steps()[-1][3]

    @property
    def carries(self) -> bool:
        """Whether any step carries or borrows in the units column (the slips of `answers.wrong_offset` follow it)."""
        return any((a % 10 + b % 10 >= 10) if op == "+" else (a % 10 < b % 10) for a, op, b, _ in self.steps())

    @property
    def text(self) -> str:
        return " ".join([str(self.numbers[0])] + [f"{op} {b}" for op, b in zip(self.ops, self.numbers[1:])])

    @property
    def prompt(self) -> str:
        return f"\n\nHuman: What is {self.text}?\n\nAssistant:"


Split = Literal["train", "validation", "test"]


def split_of(chain: Chain) -> Split:
    """The split of `chain`: the sorted tens digits of its numbers, hashed, 0 mod 6 test, 1 mod 6 validation."""
    digits = ",".join(str(d) for d in sorted(n // 10 for n in chain.numbers))
    bucket = int(hashlib.sha256(f"rlhf-chain:{digits}".encode()).hexdigest(), 16) % 6
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def held_out(chain: Chain) -> bool:
    """Whether `chain` is in a held-out split (test or validation): never trained on."""
    return split_of(chain) != "train"


def draw_chain(rng: random.Random, calls: int) -> Chain:
    """A random problem of `calls` operations: numbers uniform in [LOW, HIGH], each op + or - with equal chance
    where - keeps the running value >= 0, else +."""
    numbers = [rng.randint(LOW, HIGH) for _ in range(calls + 1)]
    ops, value = [], numbers[0]
    for b in numbers[1:]:
        op = "-" if rng.random() < 0.5 and value - b >= 0 else "+"
        value = value + b if op == "+" else value - b
        ops.append(op)
    return Chain(tuple(numbers), tuple(ops))


def draw_chains(rng: random.Random, n: int, split: Split, max_calls: int = MAX_CALLS) -> list[Chain]:
    """`n` problems of `split`, their calls cycling 1, 2, ..., `max_calls` (equal shares)."""
    out: list[Chain] = []
    while len(out) < n:
        chain = draw_chain(rng, len(out) % max_calls + 1)
        if split_of(chain) == split:
            out.append(chain)
    return out


def demonstrated(rng: random.Random, chains: list[Chain], shares: list[float] | None) -> list[Chain]:
    """The problems that get demonstrations: each of k calls with probability `shares[k - 1]` (None: all)."""
    if shares is None:
        return list(chains)
    return [c for c in chains if rng.random() < shares[c.calls - 1]]


def parse_chain(prompt: str) -> Chain | None:
    """The problem of a chained (or plain two-number) arithmetic prompt, or None for any other text."""
    m = _CHAIN.search(prompt)
    if m is None:
        return None
    first, rest = m.group(1).split(" ", 1)
    terms = _TERM.findall(rest)
    return Chain((int(first), *(int(b) for _, b in terms)), tuple(op for op, _ in terms))


def call_text(left: int, op: str, right: int) -> str:
    """One call of the calculator environment: `" <calc>37 + 48</calc>"`."""
    return f" <calc>{left} {op} {right}</calc>"


def chain_demonstrations(chain: Chain, answer: str, eos: str, observation: Callable[[str], str]) -> list[dict]:
    """The SFT rows of one demonstration: each call (right), then `answer` (the reply text, e.g. `" 56."`) after the
    last tool reply. Row k's prompt holds the turns before it, each with its `eos` and the observation as a rollout
    writes it (`observation`), so SFT trains every policy turn and never a tool token."""
    rows, context = [], chain.prompt
    for left, op, right, result in chain.steps():
        call = call_text(left, op, right)
        rows.append({"prompt": context, "response": call})
        context = context + call + eos + observation(str(result))
    rows.append({"prompt": context, "response": answer})
    return rows


def scripted_episode(chain: Chain) -> list[str]:
    """The best policy's messages: every call in order, then the last result as the answer."""
    return [call_text(a, op, b) for a, op, b, _ in chain.steps()] + [f" {chain.answer}."]
