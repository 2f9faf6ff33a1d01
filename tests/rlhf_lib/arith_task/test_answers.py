"""Responses: the answer comes first, wrong answers are distinct slips, ranked lists put the right answer first."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rlhf_lib.arith_task import (OFFSETS, Problem, answer_of, demonstration, distinct_wrong, eval_pair, ranked_list,
                                 render)
from rlhf_lib.arith_task.answers import P_CARRY_LIKE, P_TENS_SLIP
from rlhf_lib.config.data import ARITH_MAX_RESPONSES


def test_the_first_integer_of_a_response_is_its_answer():
    assert render(85) == " 85." and answer_of(render(85)) == 85 and answer_of(render(107)) == 107
    # The exact-match reward's reading: the first -?\d+ of the completion, None without one.
    assert answer_of(" -3 or 4") == -3 and answer_of(" no idea.") is None and answer_of(" 12 + 3 = 15") == 12


def test_config_limit_matches_the_offsets():
    assert ARITH_MAX_RESPONSES == 1 + len(OFFSETS) and 0 not in OFFSETS and len(set(OFFSETS)) == len(OFFSETS)


@pytest.mark.parametrize("n", range(len(OFFSETS) + 1))
def test_distinct_wrong_answers(n):
    rng = random.Random(0)
    for p in (Problem(10, 10), Problem(99, 99), Problem(37, 48)):
        wrong = distinct_wrong(rng, p, n)
        assert len(wrong) == len(set(wrong)) == n and p.answer not in wrong
        assert all(w - p.answer in OFFSETS and w > 0 for w in wrong)


def test_too_many_wrong_answers_is_an_error():
    with pytest.raises(ValueError, match="at most 6"):
        distinct_wrong(random.Random(0), Problem(37, 48), len(OFFSETS) + 1)


def test_demonstrations_are_right_at_the_asked_rate_and_slip_plausibly():
    # 4000 draws: the standard error of a share is <= 0.008, so 0.03 is a > 3.5 sigma tolerance.
    rng, carry, plain = random.Random(1), Problem(37, 48), Problem(31, 48)
    for p in (carry, plain):
        offsets = Counter(answer_of(demonstration(rng, p, 0.4)) - p.answer for _ in range(4000))
        assert offsets[0] / 4000 == pytest.approx(0.4, abs=0.03)
        assert set(offsets) <= {0, *OFFSETS}
        lost = -10 if p.carries else 10  # the carry-like tens slip: a lost carry, or a spurious one
        assert offsets[lost] / 4000 == pytest.approx(0.6 * P_TENS_SLIP * P_CARRY_LIKE, abs=0.03)
    assert all(demonstration(rng, carry, 1.0) == " 85." for _ in range(50))
    assert all(demonstration(rng, carry, 0.0) != " 85." for _ in range(50))


@pytest.mark.parametrize("k", range(2, ARITH_MAX_RESPONSES + 1))
def test_ranked_list_puts_the_right_answer_first_then_the_closest(k):
    rng = random.Random(k)
    for _ in range(20):
        p = Problem(rng.randint(10, 99), rng.randint(10, 99))
        row = ranked_list(rng, p, k)
        assert row["prompt"] == p.prompt and len(set(row["responses"])) == k
        assert sorted(row["ranking"]) == list(range(k))
        best_first = [answer_of(row["responses"][i]) for i in row["ranking"]]
        assert best_first[0] == p.answer
        distances = [abs(a - p.answer) for a in best_first]
        assert distances == sorted(distances)


def test_the_right_answer_is_not_always_in_the_same_place():
    rng = random.Random(0)
    places = Counter(ranked_list(rng, Problem(37, 48), 4)["ranking"][0] for _ in range(400))
    assert set(places) == {0, 1, 2, 3}


def test_eval_pair_chooses_the_right_answer():
    rng = random.Random(0)
    for _ in range(50):
        pair = eval_pair(rng, Problem(37, 48))
        assert pair["chosen"] == " 85." and answer_of(pair["rejected"]) != 85
