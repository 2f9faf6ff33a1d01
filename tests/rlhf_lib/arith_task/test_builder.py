"""The arithmetic builder: determinism, sizes, the held-out split, right answers, the SFT share of right answers,
readability by the pipeline's readers, and the config that selects it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlhf_lib.arith_task import answer_of, build_arithmetic_task, held_out_blocks, parse_problem, summarize
from rlhf_lib.config import DataConfig, PipelineConfig
from rlhf_lib.data import file_fingerprint, read_pairs, read_prompts, read_ranked, read_sft
from rlhf_lib.demo_task import CONTRACT_FILES

SMALL = dict(task="arithmetic", n_train_prompts=300, n_eval_prompts=40, sft_per_prompt=2, ranked_per_prompt=1,
             responses_per_list=4, eval_pairs_per_prompt=2, sft_correct=0.4)


def build(tmp: Path, name: str, **overrides: object) -> dict[str, Path]:
    return build_arithmetic_task(DataConfig(**{**SMALL, **overrides}), tmp / name)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("arith"), "a")


def test_same_seed_same_bytes_other_seed_other_data(tmp_path: Path, built: dict[str, Path]) -> None:
    again, other = build(tmp_path, "b"), build(tmp_path, "c", seed=1)
    assert set(again) == set(CONTRACT_FILES)
    for key in CONTRACT_FILES:
        assert again[key].read_bytes() == built[key].read_bytes(), key
        assert other[key].read_bytes() != built[key].read_bytes(), key


def test_independent_of_hash_seed(tmp_path: Path, built: dict[str, Path]) -> None:
    """Nothing depends on set/dict hashing: a fresh interpreter with another PYTHONHASHSEED writes the same bytes."""
    code = (
        "import sys, json; from rlhf_lib.config import DataConfig; "
        "from rlhf_lib.arith_task import build_arithmetic_task; from rlhf_lib.data import file_fingerprint; "
        f"p = build_arithmetic_task(DataConfig(**{SMALL!r}), sys.argv[1]); "
        "print(json.dumps({k: file_fingerprint(v) for k, v in p.items()}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "h")], env=env, cwd=root, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) == {k: file_fingerprint(v) for k, v in built.items()}


def test_each_file_has_its_own_stream(tmp_path: Path, built: dict[str, Path]) -> None:
    # More eval prompts change the eval files only; the training files keep their bytes.
    more = build(tmp_path, "d", n_eval_prompts=60)
    for key in ("sft", "preferences", "prompts_train"):
        assert more[key].read_bytes() == built[key].read_bytes(), key
    assert lines(more["prompts_eval"])[:40] == lines(built["prompts_eval"])


def test_sizes(built: dict[str, Path]) -> None:
    n, e = SMALL["n_train_prompts"], SMALL["n_eval_prompts"]
    sizes = {key: len(lines(path)) for key, path in built.items()}
    assert sizes == {"sft": 2 * n, "preferences": n, "prompts_train": n, "prompts_eval": e, "eval_pairs": 2 * e}
    assert len({r["prompt"] for r in lines(built["prompts_eval"])}) == e  # a pass over the pool before repeats


def test_held_out_blocks_never_reach_training(built: dict[str, Path]) -> None:
    held = held_out_blocks()
    for key in ("sft", "preferences", "prompts_train"):
        assert not any(parse_problem(r["prompt"]).block in held for r in lines(built[key])), key  # type: ignore[union-attr]
    for key in ("prompts_eval", "eval_pairs"):
        assert all(parse_problem(r["prompt"]).block in held for r in lines(built[key])), key  # type: ignore[union-attr]


def test_prompt_rows_carry_the_right_answer(built: dict[str, Path]) -> None:
    for key in ("prompts_train", "prompts_eval"):
        for row in lines(built[key]):
            problem = parse_problem(row["prompt"])
            assert problem is not None and set(row) == {"prompt", "answer"}
            assert row["answer"] == str(problem.a + problem.b)


def test_pairs_and_lists_rank_the_right_answer_first(built: dict[str, Path]) -> None:
    stats = summarize(built)
    assert stats["ranked_best_correct"] == stats["eval_chosen_correct"] == 1.0
    assert stats["eval_rejected_correct"] == 0.0
    for row in lines(built["preferences"]):
        answers = [answer_of(row["responses"][i]) for i in row["ranking"]]
        assert answers[0] == parse_problem(row["prompt"]).answer  # type: ignore[union-attr]


@pytest.mark.parametrize("share", [0.0, 0.4, 1.0])
def test_sft_correct_share(tmp_path: Path, share: float) -> None:
    # 2000 demonstrations: the standard error of the share is <= 0.011, so 0.04 is a > 3.5 sigma tolerance.
    paths = build(tmp_path, f"s{share}", n_train_prompts=1000, sft_correct=share)
    assert summarize(paths)["sft_correct"] == pytest.approx(share, abs=0.04)


def test_files_pass_the_readers_with_the_answer_column(built: dict[str, Path]) -> None:
    assert not read_sft(built["sft"]).skipped
    assert not read_ranked(built["preferences"]).skipped
    assert not read_pairs(built["eval_pairs"]).skipped
    for key in ("prompts_train", "prompts_eval"):
        result = read_prompts(built[key])
        assert not result.skipped
        assert all(set(p.columns) == {"answer"} and p.columns["answer"].isdigit() for p in result.rows)


def test_config_selects_the_task_and_refuses_user_data() -> None:
    assert DataConfig().task == "demo" and DataConfig(task="arithmetic").task == "arithmetic"
    with pytest.raises(ValidationError, match=r"data.task=arithmetic.*data.preferences"):
        PipelineConfig.model_validate({"data": {"task": "arithmetic", "preferences": "prefs.jsonl"}})
    with pytest.raises(ValidationError, match=r"data.responses_per_list \(8\) must be <= 7"):
        DataConfig(task="arithmetic", responses_per_list=8)
    assert DataConfig(task="demo", responses_per_list=8).responses_per_list == 8  # the limit is the arithmetic one's
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="sft_correct"):
            DataConfig(task="arithmetic", sft_correct=bad)
    with pytest.raises(ValidationError, match="task"):
        DataConfig(task="algebra")  # type: ignore[arg-type]


def test_a_chat_template_renders_every_row_and_keeps_the_answers(tmp_path: Path) -> None:
    """A pretrained policy's template (`data.operands` 2+1): one user turn per prompt, replies without the leading
    space, the answer column and the held-out split unchanged; the calculator's transcripts are refused."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from rlhf_lib.data.chat import Renderer

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    renderer = Renderer(lambda: tok, "auto")
    paths = build_arithmetic_task(DataConfig(**{**SMALL, "operands": "2+1"}), tmp_path / "chat", renderer)
    plain = build(tmp_path, "plain", operands="2+1")
    for key in ("prompts_train", "prompts_eval"):
        chat, text = lines(paths[key]), lines(plain[key])
        assert [r["answer"] for r in chat] == [r["answer"] for r in text]
        questions = [t["prompt"].removeprefix("\n\nHuman: ").removesuffix("\n\nAssistant:") for t in text]
        assert [c["prompt"] for c in chat] == [f"<|user|>{q}\n<|assistant|>" for q in questions]
    held = held_out_blocks("2+1")
    assert all(parse_problem(r["prompt"]).block in held for r in lines(paths["prompts_eval"]))
    assert all(r["response"] == t["response"].lstrip() for r, t in zip(lines(paths["sft"]), lines(plain["sft"])))
    assert summarize(paths)["eval_chosen_correct"] == 1.0 and renderer.conversations
    with pytest.raises(ValueError, match="set data.render=text"):
        build_arithmetic_task(DataConfig(**{**SMALL, "tool": "calculator"}), tmp_path / "tool", Renderer(lambda: tok))
    # Without a template (or with data.render=text) the rows stay HH transcripts.
    same = build_arithmetic_task(DataConfig(**{**SMALL, "operands": "2+1"}), tmp_path / "t",
                                 Renderer(lambda: tok, "text"))
    assert all(same[k].read_bytes() == plain[k].read_bytes() for k in plain)


def test_operands_are_an_arithmetic_key_and_leave_other_keys_alone() -> None:
    assert "operands" not in DataConfig(task="arithmetic").key()
    assert DataConfig(task="arithmetic", operands="2+1").key()["operands"] == "2+1"
    with pytest.raises(ValidationError, match="data.task=arithmetic only"):
        DataConfig(operands="2+1")


def test_an_instruction_follows_every_question_of_every_file(tmp_path: Path) -> None:
    """`data.instruction` (SmolLM2 starts higher when told the answer format): every prompt of the five files gets it
    after its question, nothing else changes, and it joins the data key only when set."""
    told = build(tmp_path, "told", operands="1+1", instruction="Answer with the number only.")
    plain = build(tmp_path, "plain", operands="1+1")
    for key in CONTRACT_FILES:
        for t, p in zip(lines(told[key]), lines(plain[key]), strict=True):
            assert t["prompt"] == p["prompt"].replace("?", "? Answer with the number only.", 1)
            assert {k: v for k, v in t.items() if k != "prompt"} == {k: v for k, v in p.items() if k != "prompt"}
    assert {parse_problem(r["prompt"]).a for r in lines(told["prompts_eval"])} <= set(range(1, 10))
    assert "instruction" not in DataConfig(task="arithmetic").key()
    assert DataConfig(task="arithmetic", instruction="Be brief.").key()["instruction"] == "Be brief."
    with pytest.raises(ValidationError, match="data.instruction"):
        DataConfig(instruction="Be brief.")
