from __future__ import annotations

import pytest

from rlhf_lib.rewards.builtin import exact_match, first_integer, length_target, required_format


@pytest.mark.parametrize("text, expected", [(" 85.", 85), (" It is -3, not 4", -3), ("no digits", None),
                                            (" 007", 7), ("12+3", 12)])
def test_first_integer(text, expected):
    assert first_integer(text) == expected


def test_exact_match_reads_the_first_integer_against_the_answer_column():
    got = exact_match(["p"] * 5, [" 85.", " 84.", "eighty-five", " 85 or 86", " -2"],
                      answer=["85", 85, "85", "85", "-2"])
    assert got == [1.0, 0.0, 0.0, 1.0, 1.0]


def test_exact_match_can_read_the_last_integer():
    # A chat model's "47 + 6 = 53": the first integer is an operand, the last one the answer.
    texts = ["47 + 6 = 53", "47 + 6 = 52", "53", "To add 47 and 6, we", "The answer is 53. Great!"]
    assert exact_match(["p"] * 5, texts, answer=[53] * 5, read="last") == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert exact_match(["p"] * 5, texts, answer=[53] * 5) == [0.0, 0.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="params.read is 'middle'"):
        exact_match(["p"], ["1"], answer=[1], read="middle")


def test_exact_match_without_the_column_names_it():
    with pytest.raises(ValueError, match="'answer' column"):
        exact_match(["p"], [" 1"])


def test_length_target_by_hand():
    # target 4 words, scale 4: 4 words -> 0; 2 words -> -2/4; 8 words -> -4/4; 0 words -> -1
    got = length_target(["p"] * 4, ["a b c d", "a b", "a b c d e f g h", ""], target=4)
    assert got == [0.0, -0.5, -1.0, -1.0]
    assert length_target(["p"], ["a b"], target=4, scale=8) == [-0.25]


def test_required_format_needs_the_pattern_and_by_default_the_eos():
    texts = [" Sure, here it is.", " cut off", " Done!"]
    assert required_format(["p"] * 3, texts, finished=[True, True, False]) == [1.0, 0.0, 0.0]
    assert required_format(["p"] * 3, texts, finished=[True, True, False], require_eos=False) == [1.0, 0.0, 1.0]
    assert required_format(["p"], [" 42"], pattern=r"-?\d+") == [1.0]
