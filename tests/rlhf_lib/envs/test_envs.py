"""The environment layer: the calculator's arithmetic and its refusals, the registry, the observation format (HH
transcripts and a ChatML template), and the episode loop's turn, budget and mask bookkeeping on a scripted
policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlhf_lib.envs import (
    BUILTIN,
    EnvError,
    ObservationFormat,
    Step,
    Turn,
    environment_digest,
    format_turns,
    load_environment,
    transcript_observation,
)
from rlhf_lib.envs.calculator import CalcError, CalculatorEnv, evaluate
from rlhf_lib.envs.episodes import run_episodes


@pytest.mark.parametrize("expr, value", [("37 + 48", 85), ("(7 - 2) * 3", 15), ("-4 + 10", 6), ("9 // 2", 4),
                                         ("9 / 2", 4.5), ("8 / 2", 4), ("7 % 4", 3), (" 12 ", 12)])
def test_the_calculator_evaluates_arithmetic(expr, value):
    assert evaluate(expr) == value and type(evaluate(expr)) is type(value)


@pytest.mark.parametrize("expr, why", [("__import__('os')", "unsupported"), ("2 ** 8", "unsupported"),
                                       ("1 / 0", "division by zero"), ("1 +", "cannot parse"), ("x + 1", "unsupported"),
                                       ("9" * 40, "too large"), ("1+" * 150 + "1", "too long")])
def test_the_calculator_refuses_everything_else(expr, why):
    with pytest.raises(CalcError, match=why):
        evaluate(expr)


@given(st.integers(-10**6, 10**6), st.integers(-10**6, 10**6))
def test_the_calculator_adds_and_multiplies_any_integers(a, b):
    assert evaluate(f"{a} + {b}") == a + b and evaluate(f"({a}) * ({b})") == a * b


def test_a_call_gets_the_result_and_an_answer_ends_the_episode():
    env = CalculatorEnv()
    env.reset({"prompt": "What is 37 + 48?", "answer": "85"})
    assert env.step(" <calc>37 + 48</calc>") == Step("85")
    assert env.step(" <calc>37 +</calc>") == Step("error: cannot parse '37 +'")
    assert env.step(" 85.") == Step(None, 1.0, done=True)
    assert env.step(" 84.") == Step(None, 0.0, done=True)
    assert env.step(" I do not know") == Step(None, 0.0, done=True)
    with pytest.raises(ValueError, match="'answer' column"):
        env.reset({"prompt": "hi"})


def test_the_registry_resolves_builtins_and_classes_and_names_what_is_wrong():
    assert load_environment("calculator") is CalculatorEnv and set(BUILTIN) == {"calculator", "one_op_calculator"}
    assert load_environment("one_op_calculator").__name__ == "OneOpCalculatorEnv"
    assert load_environment("rlhf_lib.envs.calculator:CalculatorEnv") is CalculatorEnv
    for name, why in [("os.system", "expected a built-in"), ("no.such.module:Env", "cannot import"),
                      ("rlhf_lib.envs.calculator:Nope", "has no class"),
                      ("rlhf_lib.envs.calculator:evaluate", "lacks reset, step")]:
        with pytest.raises(EnvError, match=why):
            load_environment(name)
    digest = environment_digest("calculator")
    assert len(digest) == 64 and environment_digest(None) is None
    assert digest == environment_digest("rlhf_lib.envs.calculator:CalculatorEnv")


def test_a_transcript_observation_follows_the_policys_eos(tiny_tokenizer):
    fmt = ObservationFormat(tiny_tokenizer, transcript=True)
    assert fmt.text("85") == transcript_observation("85") == "\n\nTool: 85\n\nAssistant:"
    assert tiny_tokenizer.decode(fmt.ids("85")) == "\n\nTool: 85\n\nAssistant:"


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_chat_observation_is_what_the_template_writes_after_the_assistants_turn(tiny_tokenizer):
    tok = tiny_tokenizer
    tok.chat_template = CHATML
    tok.eos_token = "<|endoftext|>"
    # The template's turn end is not this tokenizer's EOS here: the whole rest of the template follows the turn.
    fmt = ObservationFormat(tok, transcript=False)
    assert fmt.text("85") == "<|im_end|>\n<|im_start|>tool\n85<|im_end|>\n<|im_start|>assistant\n"
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    tok.eos_token = "<|im_end|>"  # ChatML's turn end is the EOS the policy samples: what follows it is the rest
    chatml = ObservationFormat(tok, transcript=False)
    assert chatml.text("85") == "\n<|im_start|>tool\n85<|im_end|>\n<|im_start|>assistant\n"
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ObservationFormat(tok, transcript=False)


def test_turns_read_as_one_line():
    turns = [Turn("policy", " <calc>1 + 2</calc>", 0.0), Turn("environment", "3"), Turn("policy", " 3.", 1.0)]
    assert format_turns(turns) == "policy: <calc>1 + 2</calc> | tool: 3 | policy: 3. (reward 1)"


class Scripted:
    """A policy that writes fixed token rows, one per turn, EOS-terminated where the script says."""

    def __init__(self, turns: list[list[list[int]]]):
        self.turns, self.calls = turns, []

    def __call__(self, ctx: torch.Tensor, ctx_mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.turns[len(self.calls)]
        self.calls.append((ctx.clone(), ctx_mask.clone(), n))
        width = max(len(r) for r in rows)
        out, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        return out[:, :n], mask[:, :n]


class Countdown:
    """Observes "ok" until the row's `turns` policy turns have been taken, rewarding 1 for each."""

    def reset(self, row: Mapping[str, Any]) -> None:
        self.left = row["turns"]

    def step(self, message: str) -> Step:
        self.left -= 1
        return Step(None, 1.0, done=True) if self.left == 0 else Step("ok", 1.0)


class FixedObs:
    def __init__(self, ids: list[int]):
        self._ids = ids

    def ids(self, observation: str) -> list[int]:
        return list(self._ids)


def test_episodes_interleave_turns_and_stop_at_done_max_turns_or_the_budget(tiny_tokenizer):
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    query = torch.tensor([[pad, 5, 6], [7, 8, 9], [pad, pad, 4]])
    query_mask = (query != pad).long()
    envs = []
    for turns in (1, 3, 3):
        env = Countdown()
        env.reset({"turns": turns})
        envs.append(env)
    # turn 1: all three rows write; row 0 is done after it. turn 2: rows 1 and 2; then the budget ends both.
    policy = Scripted([[[10, eos], [11, 12, eos], [13, 14, 15, eos]], [[20, eos], [21, eos]], [[30, eos]]])
    ep = run_episodes(policy, tiny_tokenizer, query, query_mask, envs, FixedObs([90, 91]), max_turns=3,
                      max_new_tokens=4, max_tokens=9)
    # Row 1 after turn 2: 7 tokens, and the observation would fill the 9 with no room for a policy token; row 2
    # after turn 2: 8. Neither gets a third turn.
    assert ep.response.tolist() == [[10, eos, pad, pad, pad, pad, pad, pad],
                                    [11, 12, eos, 90, 91, 20, eos, pad],
                                    [13, 14, 15, eos, 90, 91, 21, eos]]
    assert ep.action_mask.tolist() == [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0, 1, 1]]
    assert ep.response_mask.tolist() == [[1, 1, 0, 0, 0, 0, 0, 0], [1] * 7 + [0], [1] * 8]
    assert ep.returns.tolist() == [1.0, 2.0, 2.0]
    assert [[t.role for t in row] for row in ep.turns] == [["policy"], ["policy", "environment", "policy"],
                                                           ["policy", "environment", "policy"]]
    # Turn 2's contexts: prompt + turn 1 + observation, left-padded, for the live rows only.
    ctx, ctx_mask, n = policy.calls[1]
    assert ctx.tolist() == [[7, 8, 9, 11, 12, eos, 90, 91], [pad, 4, 13, 14, 15, eos, 90, 91]]
    assert ctx_mask.tolist() == [[1] * 8, [0] + [1] * 7] and n == 4
    assert len(policy.calls) == 2  # no third call


def test_the_last_token_of_every_episode_is_the_policys(tiny_tokenizer):
    """An observation is appended only when another policy turn follows it (max_turns reached: none)."""
    eos = tiny_tokenizer.eos_token_id
    env = Countdown()
    env.reset({"turns": 5})
    ep = run_episodes(Scripted([[[10, eos]], [[11, eos]]]), tiny_tokenizer, torch.tensor([[4]]), torch.ones(1, 1),
                      [env], FixedObs([90]), max_turns=2, max_new_tokens=4, max_tokens=64)
    assert ep.response.tolist() == [[10, eos, 90, 11, eos]] and ep.action_mask.tolist() == [[1, 1, 0, 1, 1]]
