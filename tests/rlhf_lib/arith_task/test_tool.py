"""The arithmetic task's calculator demonstrations (data.tool: calculator): each is the call, then the answer after
the tool's reply, laid out token for token as a multi-turn rollout writes it, with no environment text ever trained
on."""

from __future__ import annotations

from rlhf_lib.arith_task import build_arithmetic_task, parse_problem, summarize
from rlhf_lib.config import DataConfig
from rlhf_lib.data.records import read_sft
from rlhf_lib.envs import transcript_observation
from rlhf_lib.envs.calculator import CalculatorEnv
from rlhf_lib.models import EOS_TOKEN, train_tokenizer


def _build(tmp_path, tool):
    cfg = DataConfig(task="arithmetic", tool=tool, n_train_prompts=40, n_eval_prompts=8, sft_correct=0.3)
    return build_arithmetic_task(cfg, tmp_path / str(tool))


def test_each_demonstration_is_the_call_then_the_answer_after_the_tools_reply(tmp_path):
    rows = read_sft(_build(tmp_path, "calculator")["sft"]).rows
    assert len(rows) == 2 * 40 * 2  # sft_per_prompt 2, two rows each
    for call, answer in zip(rows[::2], rows[1::2]):
        problem = parse_problem(call.prompt)
        env = CalculatorEnv()
        env.reset({"answer": str(problem.answer)})
        assert call.response == f" <calc>{problem.a} + {problem.b}</calc>"
        assert env.step(call.response).observation == str(problem.answer)
        assert answer.prompt == call.prompt + call.response + EOS_TOKEN + transcript_observation(str(problem.answer))
        assert "Tool:" not in answer.response and "<calc>" not in answer.response


def test_the_tool_changes_only_the_demonstrations(tmp_path):
    plain, tool = _build(tmp_path, None), _build(tmp_path, "calculator")
    for key in ("preferences", "prompts_train", "prompts_eval", "eval_pairs"):
        assert plain[key].read_bytes() == tool[key].read_bytes(), key
    stats = summarize(tool)
    assert 0.1 < stats["sft_correct"] < 0.5 and stats["sft_distinct_problems"] == 40


def test_the_demonstration_tokenizes_as_the_rollout_writes_it(tmp_path):
    """SFT reads the second row's prompt as one text; a rollout builds it from the prompt, the sampled call, EOS and
    the observation's own tokens. The two token sequences must be the same."""
    rows = read_sft(_build(tmp_path, "calculator")["sft"]).rows
    tok = train_tokenizer([r.prompt + r.response for r in rows], vocab_size=512, split_digits=True)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for call, answer in zip(rows[::2], rows[1::2]):
        obs = answer.prompt.split(EOS_TOKEN)[1]
        assert ids(answer.prompt) == ids(call.prompt) + ids(call.response) + [tok.eos_token_id] + ids(obs)
