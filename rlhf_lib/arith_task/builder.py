"""Build the arithmetic task's JSONL files from a `DataConfig`: deterministic from `cfg.seed`, byte for byte.

The five files of the data contract (`FILE_NAMES`, shared with the demo task), each from its own random stream
(seeded with the seed and the file's name), so changing the size of one file leaves the others unchanged. The prompt
files carry an "answer" column (the right answer as a string of the integer) for the exact-match reward.
"""

from __future__ import annotations

import random
from pathlib import Path
from statistics import fmean
from typing import Any

from ..config import DataConfig
from ..data.chat import Renderer
from ..data.records import read_pairs, read_prompts, read_ranked, read_sft, write_jsonl
from ..demo_task.builder import FILE_NAMES
from ..envs.render import transcript_observation
from ..models import EOS_TOKEN
from .answers import answer_of, demonstration, eval_pair, ranked_list, tool_demonstrations
from .chains import Chain, chain_demonstrations, demonstrated, draw_chains, parse_chain
from .problems import Problem, problems, with_instruction


def _rng(seed: int, stream: str) -> random.Random:
    # A str seed is hashed with SHA-512 by `random`, so it is stable across processes and PYTHONHASHSEED.
    return random.Random(f"rlhf-arith-task:{seed}:{stream}")


def _draw(rng: random.Random, pool: list[Problem], n: int) -> list[Problem]:
    """`n` problems: passes over a reshuffled pool, so every distinct problem appears before any repeats."""
    out: list[Problem] = []
    while len(out) < n:
        order = list(pool)
        rng.shuffle(order)
        out.extend(order)
    return out[:n]


def _prompt_row(problem: Problem | Chain) -> dict[str, str | int]:
    row: dict[str, str | int] = {"prompt": problem.prompt, "answer": str(problem.answer)}
    if isinstance(problem, Chain):  # the calls it needs: the eval's figures by calls (eval.group_by: calls)
        row["calls"] = problem.calls
    return row


def _rendered(rows: dict[str, list[dict[str, Any]]], renderer: Renderer) -> dict[str, list[dict[str, Any]]]:
    """Every row through the policy's chat template: the prompt as one user turn, replies without the space that
    follows "Assistant:" (`Renderer.hh_prompt`, `Renderer.reply`); the answer column unchanged."""
    def row(r: dict[str, Any]) -> dict[str, Any]:
        out = dict(r, prompt=renderer.hh_prompt(r["prompt"], "prompt"))
        for col in ("response", "chosen", "rejected"):
            if col in r:
                out[col] = renderer.reply(r[col])
        if "responses" in r:
            out["responses"] = [renderer.reply(x) for x in r["responses"]]
        return out
    return {key: [row(r) for r in rs] for key, rs in rows.items()}


def build_arithmetic_task(cfg: DataConfig, out_dir: str | Path, renderer: Renderer | None = None) -> dict[str, Path]:
    """Write the arithmetic task's five JSONL files into `out_dir`; returns {"sft": path, "preferences": path, ...}.

    With `cfg.tool` ("calculator") each demonstration is two rows: the calculator call, and the answer after the
    tool's reply (`tool_demonstrations`). With a `renderer` whose policy has a chat template (a pretrained
    model.name_or_path, data.render auto or chat_template), every row is rendered through it. Sizes:
    `n_train_prompts` training problems (from the training blocks) with `sft_per_prompt` demonstrations (each right
    with probability `sft_correct`) and `ranked_per_prompt` ranked lists of `responses_per_list`; `n_eval_prompts`
    held-out problems (from the held-out blocks) with `eval_pairs_per_prompt` pairs each. `cfg.instruction` follows
    every question.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed = cfg.seed
    train: list[Problem] | list[Chain]
    evals: list[Problem] | list[Chain]
    if cfg.operands == "chain":  # the config pairs chains with the calculator's demonstrations
        train = draw_chains(_rng(seed, "prompts_train"), cfg.n_train_prompts, "train")
        evals = draw_chains(_rng(seed, "prompts_eval"), cfg.n_eval_prompts, cfg.heldout)
    else:
        train = _draw(_rng(seed, "prompts_train"), problems(False, cfg.operands), cfg.n_train_prompts)
        evals = _draw(_rng(seed, "prompts_eval"), problems(True, cfg.operands), cfg.n_eval_prompts)

    rng = _rng(seed, "sft")
    if cfg.operands == "chain":  # every call right; a share of the problems of each number of calls demonstrated
        shown = demonstrated(_rng(seed, "sft_cover"), train, cfg.sft_call_shares)
        sft = [row for p in shown for _ in range(cfg.sft_per_prompt)
               for row in chain_demonstrations(p, demonstration(rng, p, cfg.sft_correct), EOS_TOKEN,
                                               transcript_observation)]
    elif cfg.tool == "calculator":  # the call, then the answer after the tool's reply: two rows per demonstration
        sft = [row for p in train for _ in range(cfg.sft_per_prompt)
               for row in tool_demonstrations(rng, p, cfg.sft_correct, EOS_TOKEN, transcript_observation)]
    else:
        sft = [{"prompt": p.prompt, "response": demonstration(rng, p, cfg.sft_correct)}
               for p in train for _ in range(cfg.sft_per_prompt)]
    rng = _rng(seed, "preferences")
    prefs = [ranked_list(rng, p, cfg.responses_per_list) for p in train for _ in range(cfg.ranked_per_prompt)]
    rng = _rng(seed, "eval_pairs")
    pairs = [eval_pair(rng, p) for p in evals for _ in range(cfg.eval_pairs_per_prompt)]

    rows: dict[str, list[dict[str, Any]]] = {
        "sft": sft,
        "preferences": prefs,
        "prompts_train": [_prompt_row(p) for p in train],
        "prompts_eval": [_prompt_row(p) for p in evals],
        "eval_pairs": pairs,
    }
    if cfg.instruction:
        rows = {key: [dict(r, prompt=with_instruction(r["prompt"], cfg.instruction)) for r in rs]
                for key, rs in rows.items()}
    if renderer is not None and renderer.templated():
        if cfg.tool is not None:
            raise ValueError("data.tool: the calculator demonstrations are written as HH transcripts; with a chat "
                             "template (model.name_or_path) set data.render=text")
        rows = _rendered(rows, renderer)
    return {key: write_jsonl(out / FILE_NAMES[key], rows[key]) for key in rows}


def _right(prompt: str, response: str) -> bool:
    problem = parse_chain(prompt)  # a plain problem "What is 37 + 48?" is a chain of one call
    assert problem is not None, "arithmetic prompts always hold a problem"
    return answer_of(response) == problem.answer


def summarize(paths: dict[str, Path]) -> dict[str, float]:
    """Statistics of built files (for source.json, the README and sanity checks).

    Keys: `sft_correct` (share of right answers among the demonstrations), `sft_distinct_problems`, `ranked_best_correct` (share of
    lists ranking the right answer first: 1.0), `eval_chosen_correct` / `eval_rejected_correct` (1.0 / 0.0),
    `eval_distinct_problems`.
    """
    sft = read_sft(paths["sft"]).rows
    ranked = read_ranked(paths["preferences"]).rows
    pairs = read_pairs(paths["eval_pairs"]).rows
    evals = read_prompts(paths["prompts_eval"]).rows
    return {
        # With the calculator, the call rows give no answer: the share is over the answer rows.
        "sft_correct": fmean(_right(e.prompt, e.response) for e in sft if "<calc>" not in e.response),
        "sft_distinct_problems": float(len({parse_chain(e.prompt) for e in sft})),
        "ranked_best_correct": fmean(_right(e.prompt, e.responses[0]) for e in ranked),
        "eval_chosen_correct": fmean(_right(e.prompt, e.chosen) for e in pairs),
        "eval_rejected_correct": fmean(_right(e.prompt, e.rejected) for e in pairs),
        "eval_distinct_problems": float(len({e.prompt for e in evals})),
    }
