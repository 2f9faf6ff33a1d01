"""What a model's reply or a run's parameters reach is bounded (issue 55): the calculator refuses non-finite and
oversized numbers with `CalcError`, the answer readers and every built-in reward take any string without raising,
an environment step that raises becomes an error observation for its episode, a pattern from a parameter is matched
with a time limit, and a function reward past its time limit fails with one line."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_lib.envs import Step
from rlhf_lib.envs.calculator import CalcError, CalculatorEnv, evaluate
from rlhf_lib.rewards import builtin
from rlhf_lib.rewards.base import RewardError, TextBatch
from rlhf_lib.rewards.functions import FunctionReward, call_with_limit

# The replies of the experiments: each killed a batch before.
HOSTILE = ["1e999", "-1e999", "1/1e-320", "1e309-1e309", "1e308 * 10", "9" * 31, "(10**3)", "1e30", "-(1e300*1e10)"]


@pytest.mark.parametrize("expr", HOSTILE)
def test_the_calculator_refuses_infinities_and_oversized_numbers(expr):
    with pytest.raises(CalcError):
        evaluate(expr)


@pytest.mark.parametrize("expr", HOSTILE)
def test_a_hostile_call_is_an_error_observation_never_an_exception(expr):
    env = CalculatorEnv()
    env.reset({"answer": "5"})
    step = env.step(f"<calc>{expr}</calc>")
    assert step.observation.startswith("error:") and not step.done


def test_a_huge_digit_run_is_no_answer():
    """A 4,301-digit number raised ValueError in int() (Python's cap) inside the calculator and exact_match."""
    big = "7" * 4301
    env = CalculatorEnv()
    env.reset({"answer": "7"})
    assert env.step(big) == Step(None, 0.0, done=True)
    assert builtin.exact_match(["q"], [big], answer=["7"]) == [0.0]
    assert builtin.exact_match(["q"], [f"{big} then 7"], answer=["7"], read="last") == [1.0]
    assert builtin.first_integer("x" + "1" * 64) == int("1" * 64) and builtin.first_integer("1" * 65) is None
    with pytest.raises(ValueError, match="not an integer"):
        builtin.exact_match(["q"], ["1"], answer=["9" * 100])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_the_calculator_and_readers_take_any_text(text):
    env = CalculatorEnv()
    env.reset({"answer": "12"})
    for message in (text, f"<calc>{text}</calc>"):
        step = env.step(message)
        assert isinstance(step, Step)
    try:
        evaluate(text)
    except CalcError:
        pass


ATOMS = st.one_of(st.integers(-10**40, 10**40).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                  st.sampled_from(["1e999", "1e-320", "0", "(", ")", "-", "9" * 50]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ATOMS, st.sampled_from(["+", "-", "*", "/", "//", "%", " "])), min_size=1, max_size=6))
def test_random_expressions_raise_only_calc_error(parts):
    expression = "".join(a + op for a, op in parts).rstrip("+-*/% ")
    try:
        value = evaluate(expression)
    except CalcError:
        return
    assert abs(value) < 10**30


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=120), min_size=1, max_size=4), st.booleans())
def test_every_built_in_reward_takes_any_reply(completions, finished):
    n = len(completions)
    prompts, done = ["q"] * n, [finished] * n
    for read in ("first", "last"):
        assert len(builtin.exact_match(prompts, completions, answer=["3"] * n, read=read)) == n
    assert len(builtin.length_target(prompts, completions)) == n
    assert len(builtin.required_format(prompts, completions, finished=done)) == n


def test_a_catastrophic_pattern_is_stopped_by_its_time_limit(monkeypatch):
    """`(.+)+c` on 30 characters backtracks for minutes with `re` (x4 every 2 characters); `regex` answers it at once.
    `(a|aa)+$` on 40 a's and a "!" backtracks in `regex` too: its timeout stops it."""
    assert builtin.required_format(["q"], ["a" * 30], pattern="(.+)+c", require_eos=False) == [0.0]
    monkeypatch.setattr(builtin, "MATCH_TIMEOUT_S", 0.2)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"took over 0.2 s on a 41-character reply"):
        builtin.required_format(["q"], ["a" * 40 + "!"], pattern="(a|aa)+$", require_eos=False)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(ValueError, match="does not compile"):
        builtin.required_format(["q"], ["a"], pattern="(")
    with pytest.raises(ValueError, match="at most 1000"):
        builtin.required_format(["q"], ["a"], pattern="a" * 1001)


def slow_reward(prompts, completions, **_):
    time.sleep(5)
    return [0.0] * len(completions)


def test_a_function_reward_past_its_time_limit_fails_with_one_line():
    reward = FunctionReward(f"{__name__}:slow_reward", {}, "reward 'slow' (function slow)", timeout_s=0.2)
    batch = TextBatch(["q"], ["a"], [True], {})
    t0 = time.perf_counter()
    with pytest.raises(RewardError, match=r"^reward 'slow' \(function slow\): the function took over 0.2 s"):
        reward(batch)
    assert time.perf_counter() - t0 < 2
    assert call_with_limit(1.0, lambda x: x + 1, 1) == 2
    with pytest.raises(KeyError):
        call_with_limit(1.0, lambda: {}["x"])


class Exploding:
    """An environment whose step raises on one message: a bug, or a reply it did not expect."""

    def reset(self, row):
        pass

    def step(self, message):
        if "boom" in message:
            raise OverflowError("cannot convert float infinity to integer")
        return Step(None, 1.0, done=True)


def test_an_environment_step_that_raises_costs_its_episode_not_the_batch(tiny_tokenizer):
    from rlhf_lib.envs import ObservationFormat
    from rlhf_lib.envs.episodes import run_episodes

    tok = tiny_tokenizer
    replies = iter([[" boom", " fine"], [" 7"]])

    def generate(ctx, mask, n):  # a scripted policy: the rows' replies of this turn
        rows = [tok(t, add_special_tokens=False)["input_ids"] for t in next(replies)]
        width = max(map(len, rows))
        ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
        return ids, (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()

    q = torch.tensor([[5, 6], [5, 6]])
    ep = run_episodes(generate, tok, q, torch.ones_like(q), [Exploding(), Exploding()],
                      ObservationFormat(tok, True), max_turns=2, max_new_tokens=4, max_tokens=512)
    assert ep.returns.tolist() == [1.0, 1.0], ep.turns  # row 0 read the error, then answered; row 1 at once
    assert ep.turns[0][0].failed and ep.turns[0][1].text.startswith("error: the environment failed")
    assert not any(t.failed for t in ep.turns[1])
