"""Chained arithmetic for the one-operation calculator (data.operands: chain, issue 54 item 4): hand-computed
problems, the split that holds a multiset of numbers out in every order, demonstrations of a share of the problems
of each number of calls (data.sft_call_shares), and the environment that refuses more than one operation a call."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhf_lib.arith_task import build_arithmetic_task, summarize
from rlhf_lib.arith_task.chains import (Chain, chain_demonstrations, draw_chain, draw_chains, held_out, parse_chain,
                                        scripted_episode, split_of)
from rlhf_lib.config import DataConfig
from rlhf_lib.data.records import read_sft
from rlhf_lib.envs import transcript_observation
from rlhf_lib.envs.calculator import OneOpCalculatorEnv
from rlhf_lib.models import EOS_TOKEN


def test_a_chain_is_evaluated_left_to_right_one_call_a_step():
    c = Chain((82, 38, 40, 28), ("+", "-", "-"))
    assert c.steps() == [(82, "+", 38, 120), (120, "-", 40, 80), (80, "-", 28, 52)]
    assert (c.answer, c.calls, c.text) == (52, 3, "82 + 38 - 40 - 28")
    assert c.prompt == "\n\nHuman: What is 82 + 38 - 40 - 28?\n\nAssistant:"
    assert c.carries  # 82 + 38: 2 + 8 carries
    assert not Chain((21, 13), ("+",)).carries and Chain((21, 13), ("-",)).answer == 8


numbers = st.integers(10, 99)


@given(st.lists(numbers, min_size=2, max_size=4), st.lists(st.sampled_from("+-"), min_size=3, max_size=3),
       st.text(max_size=20))
def test_parse_reads_back_every_chain_in_any_surrounding_text(nums, ops, noise):
    chain = Chain(tuple(nums), tuple(ops[: len(nums) - 1]))
    assert parse_chain(noise + chain.prompt + " Answer with the number only.") == chain


@given(st.text(max_size=60))
def test_parse_of_any_text_is_a_chain_or_none(text):
    got = parse_chain(text)
    assert got is None or (1 <= got.calls <= 3 and isinstance(got.answer, int))


@given(st.lists(numbers, min_size=2, max_size=4), st.randoms(use_true_random=False))
def test_the_split_holds_a_multiset_out_in_every_order_and_sign(nums, rng):
    order = list(nums)
    rng.shuffle(order)
    first = Chain(tuple(nums), ("+",) * (len(nums) - 1))
    other = Chain(tuple(order), tuple(rng.choice("+-") for _ in order[1:]))
    assert split_of(first) == split_of(other)


def test_draws_cycle_the_calls_and_keep_to_their_side_of_the_split():
    train = draw_chains(random.Random(0), 300, "train")
    evals = draw_chains(random.Random(1), 60, "test")
    val = draw_chains(random.Random(1), 60, "validation")
    assert [c.calls for c in train[:6]] == [1, 2, 3, 1, 2, 3]
    assert not any(held_out(c) for c in train) and all(split_of(c) == "test" for c in evals)
    digits = lambda cs: {tuple(sorted(n // 10 for n in c.numbers)) for c in cs}  # noqa: E731
    assert not digits(train) & digits(evals) and not digits(train) & digits(val) and not digits(val) & digits(evals)
    assert all(v >= 0 for c in train for *_, v in c.steps())  # - only where the running value stays >= 0
    rng = random.Random(2)
    share = sum(held_out(draw_chain(rng, 1 + i % 3)) for i in range(3000)) / 3000
    assert 0.2 < share < 0.45  # about a third of the problems held out: a sixth test, a sixth validation


def test_the_scripted_policy_solves_every_problem_through_the_one_operation_calculator():
    for chain in draw_chains(random.Random(3), 30, "test"):
        env = OneOpCalculatorEnv()
        env.reset({"answer": str(chain.answer)})
        steps = [env.step(m) for m in scripted_episode(chain)]
        assert [s.observation for s in steps[:-1]] == [str(r) for *_, r in chain.steps()]
        assert steps[-1].done and steps[-1].reward == 1.0


@pytest.mark.parametrize("call", ["37 + 48 - 29", "(37 + 48)", "85 / 5", "85 // 5", "x + 1", "2 ** 8", ""])
def test_the_one_operation_calculator_refuses_anything_but_one_operation_of_two_integers(call):
    env = OneOpCalculatorEnv()
    env.reset({"answer": "85"})
    step = env.step(f" <calc>{call}</calc>")
    assert step.observation.startswith("error: one operation") and step.reward == 0 and not step.done


def test_the_one_operation_calculator_computes_and_reads_the_answer():
    env = OneOpCalculatorEnv()
    env.reset({"answer": "-15"})
    assert env.step(" <calc> -5 * 3 </calc>").observation == "-15"
    assert env.step(" <calc>120 - 40</calc>").observation == "80"
    assert env.step(" -15.").reward == 1.0


def _cfg(**kw):
    return DataConfig(task="arithmetic", operands="chain", tool="calculator", n_train_prompts=30, n_eval_prompts=9,
                      sft_correct=1.0, **kw)


def test_demonstrations_cover_the_given_share_of_each_number_of_calls(tmp_path):
    paths = build_arithmetic_task(_cfg(sft_call_shares=[1.0, 1.0, 0.0]), tmp_path)
    rows = read_sft(paths["sft"]).rows
    # 30 prompts: 10 of each number of calls; the 20 of one and two calls demonstrated twice (sft_per_prompt 2),
    # a row per call and one for the answer: 10 x 2 x 2 + 10 x 2 x 3 rows.
    assert len(rows) == 100
    assert max(parse_chain(r.prompt).calls for r in rows) == 2
    some = read_sft(build_arithmetic_task(_cfg(sft_call_shares=[1.0, 1.0, 0.5]), tmp_path / "half")["sft"]).rows
    threes = {r.prompt for r in some if parse_chain(r.prompt).calls == 3 and "Tool" not in r.prompt}
    assert 1 <= len(threes) <= 9  # about half of the 10 three-call problems
    every = read_sft(build_arithmetic_task(_cfg(), tmp_path / "all")["sft"]).rows
    assert len(every) == 100 + 10 * 2 * 4
    prompts = [json.loads(x) for x in paths["prompts_train"].read_text().splitlines()]
    assert sorted({p["calls"] for p in prompts}) == [1, 2, 3]  # PPO is asked all three
    evals = [json.loads(x) for x in paths["prompts_eval"].read_text().splitlines()]
    assert [e["calls"] for e in evals] == [1, 2, 3] * 3
    assert summarize(paths)["sft_correct"] == 1.0


def test_each_demonstration_row_is_the_rollout_so_far_and_the_next_policy_turn():
    chain = Chain((82, 38, 40), ("+", "-"))
    rows = chain_demonstrations(chain, " 80.", EOS_TOKEN, transcript_observation)
    assert [r["response"] for r in rows] == [" <calc>82 + 38</calc>", " <calc>120 - 40</calc>", " 80."]
    assert rows[1]["prompt"] == chain.prompt + rows[0]["response"] + EOS_TOKEN + transcript_observation("120")
    assert rows[2]["prompt"] == rows[1]["prompt"] + rows[1]["response"] + EOS_TOKEN + transcript_observation("80")


def test_the_config_pairs_chains_with_the_calculator_and_keeps_other_keys():
    with pytest.raises(ValueError, match="data.tool: calculator"):
        DataConfig(task="arithmetic", operands="chain")
    with pytest.raises(ValueError, match="sft_call_shares"):
        DataConfig(task="arithmetic", sft_call_shares=[1, 1, 0])
    with pytest.raises(ValueError):
        _cfg(sft_call_shares=[1, 1])
    assert "sft_call_shares" not in DataConfig(task="arithmetic").key()
    assert _cfg(sft_call_shares=[1, 1, 0.05]).key()["sft_call_shares"] == [1, 1, 0.05]


def test_validation_problems_are_the_eval_set_only_when_asked(tmp_path):
    def evals(heldout):
        path = build_arithmetic_task(_cfg(heldout=heldout), tmp_path / heldout)["prompts_eval"]
        return [parse_chain(json.loads(line)["prompt"]) for line in path.read_text().splitlines()]

    assert {split_of(c) for c in evals("test")} == {"test"}
    assert {split_of(c) for c in evals("validation")} == {"validation"}
