"""The synthetic demo task: HH-format prompts, a response generator, a hidden gold judge, and the data builder.

See docs/data.md. It lives inside the package so that an installed `rlhf` can build its own demo data.
"""

from __future__ import annotations

from .builder import EVAL_PAIR_MARGIN, FILE_NAMES, build_demo_task, eval_pair, ranked_list, summarize
from .judge import gold_breakdown, gold_score
from .responses import BROAD_MIX, SFT_MIX, Mix, ResponseSpec, render, sample_response, sample_spec
from .slots import (
    ASKS,
    TONES,
    TOPIC_NAMES,
    TOPICS,
    held_out_combos,
    make_prompt,
    parse_topic,
    prompt_slots,
    prompts_for,
    train_combos,
)

__all__ = [
    "ASKS",
    "BROAD_MIX",
    "EVAL_PAIR_MARGIN",
    "FILE_NAMES",
    "Mix",
    "ResponseSpec",
    "SFT_MIX",
    "TONES",
    "TOPICS",
    "TOPIC_NAMES",
    "build_demo_task",
    "eval_pair",
    "gold_breakdown",
    "gold_score",
    "held_out_combos",
    "make_prompt",
    "parse_topic",
    "prompt_slots",
    "prompts_for",
    "ranked_list",
    "render",
    "sample_response",
    "sample_spec",
    "summarize",
    "train_combos",
]
