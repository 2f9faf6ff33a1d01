"""Responses of the arithmetic task: the right answer, plausibly wrong ones, and the rows built from them.

A response is `" 85."`: the answer first, so the first integer of a completion is the answer the exact-match reward
(`rlhf_lib.rewards.builtin:exact_match`) reads, and one fixed, short layout (5-6 tokens with EOS, digits one token
each) that a tiny model learns in a few hundred steps. The leading space follows "Assistant:" as in the demo task.

Wrong answers are the slips a person (or a half-trained model) makes: a units slip (off by 1 or 2) or a tens slip
(off by 10), where a problem that carries mostly loses its carry (-10) and one that does not gains a spurious one
(+10). They differ from the right answer in one or two digits, so a wrong demonstration looks like a right one.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from .problems import Problem

UNIT_SLIPS: tuple[int, ...] = (-2, -1, 1, 2)
TENS_SLIPS: tuple[int, ...] = (-10, 10)
OFFSETS: tuple[int, ...] = UNIT_SLIPS + TENS_SLIPS  # every wrong answer is the right one plus one of these
P_TENS_SLIP = 0.5  # share of wrong demonstrations that slip in the tens (the rest slip in the units)
P_CARRY_LIKE = 0.8  # share of tens slips that follow the carry: -10 when the problem carries, +10 when it does not
# How the exact-match reward reads a completion: its first integer is the answer.
_FIRST_INT = re.compile(r"-?\d+")


def answer_of(response: str) -> int | None:
    """The answer a response gives (its first integer), as the exact-match reward reads it; None without one."""
    m = _FIRST_INT.search(response)
    return int(m.group()) if m else None


def render(answer: int) -> str:
    """The response giving `answer`: `" 85."`."""
    return f" {answer}."


def wrong_offset(rng: random.Random, problem: Problem) -> int:
    """A slip: a units slip (+-1, +-2), or a tens slip of 10 that mostly follows the carry (see module docstring)."""
    if rng.random() >= P_TENS_SLIP:
        return rng.choice(UNIT_SLIPS)
    follows_carry = rng.random() < P_CARRY_LIKE
    return -10 if problem.carries == follows_carry else 10


def demonstration(rng: random.Random, problem: Problem, p_correct: float) -> str:
    """An SFT response: right with probability `p_correct`, else off by one slip."""
    if rng.random() < p_correct:
        return render(problem.answer)
    return render(problem.answer + wrong_offset(rng, problem))


def distinct_wrong(rng: random.Random, problem: Problem, n: int) -> list[int]:
    """`n` distinct wrong answers, in the order drawn: slips first, then the offsets not drawn yet in a random order.

    Drawing slips until `n` are distinct would loop on n = len(OFFSETS); the fallback fills the rest evenly.
    """
    if n > len(OFFSETS):
        raise ValueError(f"{n} distinct wrong answers asked for; at most {len(OFFSETS)} exist (offsets {OFFSETS})")
    offsets: list[int] = []
    for _ in range(4 * n):
        if len(offsets) == n:
            break
        off = wrong_offset(rng, problem)
        if off not in offsets:
            offsets.append(off)
    rest = [o for o in OFFSETS if o not in offsets]
    rng.shuffle(rest)
    offsets += rest[: n - len(offsets)]
    return [problem.answer + o for o in offsets]


def ranked_list(rng: random.Random, problem: Problem, k: int) -> dict[str, Any]:
    """K distinct responses in a random order, ranked: the right answer first, then the wrong ones closest first.

    Closer-is-better among wrong answers is the labeller's judgement of partial credit (a units slip beats a tens
    slip); a tie in distance (+1 and -1) keeps the order drawn. The exact-match reward ignores this order.
    """
    answers = [problem.answer, *distinct_wrong(rng, problem, k - 1)]
    order = list(range(k))
    rng.shuffle(order)
    responses = [render(answers[i]) for i in order]
    # Position of each answer in the shuffled list, ranked by (distance to the right answer, drawing order).
    ranking = sorted(range(k), key=lambda pos: (abs(answers[order[pos]] - problem.answer), order[pos]))
    return {"prompt": problem.prompt, "responses": responses, "ranking": ranking}


def eval_pair(rng: random.Random, problem: Problem) -> dict[str, str]:
    """A held-out pair: the right answer chosen, a slip rejected."""
    (wrong,) = distinct_wrong(rng, problem, 1)
    return {"prompt": problem.prompt, "chosen": render(problem.answer), "rejected": render(wrong)}


def tool_call(problem: Problem) -> str:
    """The policy's call of the calculator environment (rlhf_lib/envs/calculator.py): `" <calc>37 + 48</calc>"`."""
    return f" <calc>{problem.a} + {problem.b}</calc>"


def tool_demonstrations(rng: random.Random, problem: Problem, p_correct: float, eos: str,
                        observation: Callable[[str], str]) -> list[dict[str, str]]:
    """The two SFT rows of one demonstration with the calculator: the call (the first policy turn), then the answer
    after the tool's reply (the second), right with probability `p_correct` as `demonstration`'s. The second row's
    prompt holds the first turn, its `eos` and the observation as a rollout writes them (`observation`: the
    environment's text after the policy's EOS), so SFT trains every policy turn and never a tool token."""
    call = tool_call(problem)
    answer = demonstration(rng, problem, p_correct)
    then = problem.prompt + call + eos + observation(str(problem.answer))
    return [{"prompt": problem.prompt, "response": call}, {"prompt": then, "response": answer}]
