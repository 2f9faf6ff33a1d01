from __future__ import annotations

import pytest

from rlhf_lib.rewards.base import RewardError, TextBatch, check_scores
from rlhf_lib.rewards.functions import FunctionReward, function_digest, import_function
from tests.rlhf_lib.rewards import sample_rewards

MOD = "tests.rlhf_lib.rewards.sample_rewards"
SOURCE = "reward 'f' (function x)"


def _batch(n=3):
    return TextBatch([f"p{i}" for i in range(n)], ["a", "bb", "ccc"][:n], [True, False, True][:n],
                     {"answer": ["1", "2", "3"][:n]})


def test_the_function_gets_texts_finished_columns_and_params():
    sample_rewards.CALLS.clear()
    got = FunctionReward(f"{MOD}:count_letters", {"extra": 7}, SOURCE)(_batch())
    assert got == [1.0, 2.0, 3.0]
    (call,) = sample_rewards.CALLS
    assert call == {"prompts": ["p0", "p1", "p2"], "completions": ["a", "bb", "ccc"],
                    "finished": [True, False, True], "answer": ["1", "2", "3"], "extra": 7}


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    (f"{MOD}:missing", "has no attribute 'missing'"),
    (f"{MOD}:NOT_CALLABLE", "is a int, not a function"),
])
def test_a_bad_spec_names_the_source(spec, message):
    with pytest.raises(RewardError, match=message) as e:
        import_function(spec, SOURCE)
    assert str(e.value).startswith(SOURCE)


@pytest.mark.parametrize("name, message", [
    ("too_few", "returned 2 scores for a batch of 3 rows"),
    ("not_finite", "row 0: score nan is not finite"),
    ("raises", "the function raised KeyError: 'answer'"),
])
def test_a_bad_result_names_the_source_and_row(name, message):
    with pytest.raises(RewardError, match=message) as e:
        FunctionReward(f"{MOD}:{name}", {}, SOURCE)(_batch())
    assert str(e.value).startswith(SOURCE)


def test_check_scores_takes_numbers_and_bools_only():
    assert check_scores([1, True, 2.5], 3, "s") == [1.0, 1.0, 2.5]
    with pytest.raises(RewardError, match="row 1: score 'x' is not a number"):
        check_scores([1.0, "x"], 2, "s")
    with pytest.raises(RewardError, match="returned int"):
        check_scores(3, 1, "s")


def test_the_digest_follows_the_module_source(tmp_path, monkeypatch):
    mod = tmp_path / "my_reward_mod.py"
    mod.write_text("def f(prompts, completions, **_):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = function_digest("my_reward_mod:f", SOURCE)
    assert first == function_digest("my_reward_mod:f", SOURCE)
    assert first != function_digest(f"{MOD}:constant", SOURCE)


def test_text_batch_checks_lengths_and_json():
    with pytest.raises(ValueError, match="2 prompts but"):
        TextBatch(["a", "b"], ["x"], [True, True])
    b = _batch()
    assert TextBatch.from_json(b.to_json()) == b
    with pytest.raises(ValueError, match="field 'completions' must be a list of strings"):
        TextBatch.from_json({"prompts": ["a"], "completions": [1]})
    with pytest.raises(ValueError, match="field 'finished'"):
        TextBatch.from_json({"prompts": ["a"], "completions": ["b"], "finished": ["yes"]})
