"""The synthetic demo task: HH-format prompts, a response generator, a hidden gold judge, and the data builder.

See docs/data.md. It lives inside the package so that an installed `rlhf` can build its own demo data.
"""

from __future__ import annotations

from .adversarial import KINDS as ADVERSARIAL_KINDS
from .adversarial import adversarial_pairs
from .builder import CONTRACT_FILES, EVAL_PAIR_MARGIN, FILE_NAMES, build_demo_task, eval_pair, ranked_list, summarize
from .judge import gold_breakdown, gold_score
from .responses import BROAD_MIX, SFT_MIX, Mix, ResponseSpec, render, sample_response, sample_spec
from .slots import (
    ASKS,
    TEST_TOPICS,
    TONES,
    TOPIC_NAMES,
    TOPICS,
    VAL_TOPICS,
    facts_of,
    held_out_combos,
    make_prompt,
    parse_topic,
    prompt_slots,
    prompts_for,
    split_combos,
    topics_of,
    train_combos,
)

__all__ = [
    "ADVERSARIAL_KINDS",
    "ASKS",
    "CONTRACT_FILES",
    "BROAD_MIX",
    "EVAL_PAIR_MARGIN",
    "FILE_NAMES",
    "Mix",
    "ResponseSpec",
    "SFT_MIX",
    "TONES",
    "TEST_TOPICS",
    "TOPICS",
    "TOPIC_NAMES",
    "VAL_TOPICS",
    "adversarial_pairs",
    "build_demo_task",
    "eval_pair",
    "facts_of",
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
    "split_combos",
    "summarize",
    "topics_of",
    "train_combos",
]
