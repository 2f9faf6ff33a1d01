"""Problems and the split over operand ranges: prompt format, parsing, and what the held-out blocks leave in
training."""

from __future__ import annotations

from collections import Counter

from rlhf_lib.arith_task import HIGH, LOW, Problem, held_out_blocks, parse_problem, problems
from rlhf_lib.arith_task.problems import with_instruction
from rlhf_lib.demo_task import make_prompt


def test_prompt_is_an_hh_transcript_like_the_demo():
    p = Problem(37, 48)
    assert p.prompt == "\n\nHuman: What is 37 + 48?\n\nAssistant:"
    demo = make_prompt("chess", 0)
    assert p.prompt.startswith("\n\nHuman: ") and p.prompt.endswith(demo[demo.index("\n\nAssistant:"):])
    assert (p.answer, p.block, p.carries) == (85, (3, 4), True)  # 7 + 8 = 15 carries
    assert not Problem(31, 48).carries


def test_parse_problem_inverts_the_prompt():
    assert all(parse_problem(p.prompt) == p for p in problems(True)[::37] + problems(False)[::101])
    assert parse_problem("\n\nHuman: Any tips about chess?\n\nAssistant:") is None


def test_held_out_blocks_are_a_diagonal_and_its_mirror():
    blocks = held_out_blocks()
    # tb = ta + 3 cyclically over 1..9, and the mirror of each: two blocks per row and per column.
    diagonal = [(1, 4), (2, 5), (3, 6), (4, 7), (5, 8), (6, 9), (7, 1), (8, 2), (9, 3)]
    assert sorted(blocks) == sorted(diagonal + [(b, a) for a, b in diagonal])
    assert sorted(a for a, _ in blocks) == sorted(b for _, b in blocks) == sorted(list(range(1, 10)) * 2)


def test_split_is_a_partition_of_all_two_digit_sums():
    train, held = problems(False), problems(True)
    assert (len(train), len(held)) == (6300, 1800)
    assert not set(train) & set(held)
    assert set(train) | set(held) == {Problem(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)}
    assert all(p.block in held_out_blocks() for p in held) and not any(p.block in held_out_blocks() for p in train)


def test_training_covers_every_digit_and_every_tens_sum_of_eval():
    # What a model needs to generalise to the held-out blocks is all in training, only not in these combinations.
    train, held = problems(False), problems(True)
    partners = Counter(p.block for p in train)
    assert all(sum(n for (ta, _), n in partners.items() if ta == t) == 7 * 100 for t in range(1, 10))
    assert all(sum(n for (_, tb), n in partners.items() if tb == t) == 7 * 100 for t in range(1, 10))
    assert {sum(p.block) for p in held} <= {sum(p.block) for p in train}
    assert {p.answer for p in held} <= {p.answer for p in train}


def test_two_plus_one_digit_operands_hold_out_three_diagonals():
    train, held = problems(False, "2+1"), problems(True, "2+1")
    assert (len(train), len(held)) == (540, 270) and not set(train) & set(held)
    assert set(train) | set(held) == {Problem(a, b) for a in range(10, 100) for b in range(1, 10)}
    assert Problem(47, 6).block == (4, 6) and Problem(47, 6).prompt.endswith("What is 47 + 6?\n\nAssistant:")
    blocks = held_out_blocks("2+1")
    assert len(blocks) == 27 and {(1, 4), (1, 6), (1, 8)} <= blocks and (4, 1) not in blocks
    # Every tens digit of a and every b keeps 6 of its 9 partners in training.
    partners = Counter(p.block for p in train)
    assert all(sum(n for (ta, _), n in partners.items() if ta == t) == 6 * 10 for t in range(1, 10))
    assert all(sum(n for (_, b), n in partners.items() if b == t) == 6 * 10 for t in range(1, 10))
    assert all(parse_problem(p.prompt) == p for p in held[::13])


def test_one_digit_operands_hold_out_unordered_pairs_and_a_band_of_sums():
    """No held-out problem's twin (b + a) is trained on, and no training problem's answer is 10."""
    train, held = problems(False, "1+1"), problems(True, "1+1")
    assert (len(train), len(held)) == (56, 25) and not set(train) & set(held)
    assert set(train) | set(held) == {Problem(a, b) for a in range(1, 10) for b in range(1, 10)}
    assert all(Problem(p.b, p.a) in set(held) for p in held)  # every twin is held out with it
    assert {p for p in held if p.answer == 10} == {Problem(a, 10 - a) for a in range(1, 10)}
    assert 10 not in {p.answer for p in train}
    assert Problem(7, 8).block == (7, 8) and {Problem(1, 4), Problem(4, 1), Problem(9, 3), Problem(3, 9)} <= set(held)
    assert Counter(p.a for p in held) == Counter(p.b for p in held)


def test_an_instruction_follows_the_question_and_keeps_the_problem_readable():
    prompt = Problem(7, 8).prompt
    told = with_instruction(prompt, "Answer with the number only.")
    assert told == "\n\nHuman: What is 7 + 8? Answer with the number only.\n\nAssistant:"
    assert parse_problem(told) == Problem(7, 8)
    assert with_instruction(prompt, None) == prompt and with_instruction("no question", "Say 3.") == "no question"
