"""The arithmetic task: "What is 37 + 48?" in HH format, an answer the exact-match reward can verify, noisy
demonstrations, and a split over operand ranges. See docs/data.md.

It lives next to the demo task, inside the package, so that an installed `rlhf` can build its data.
"""

from __future__ import annotations

from .answers import OFFSETS, answer_of, demonstration, distinct_wrong, eval_pair, ranked_list, render, wrong_offset
from .builder import build_arithmetic_task, summarize
from .problems import HIGH, LOW, Problem, held_out_blocks, parse_problem, problems

__all__ = [
    "HIGH",
    "LOW",
    "OFFSETS",
    "Problem",
    "answer_of",
    "build_arithmetic_task",
    "demonstration",
    "distinct_wrong",
    "eval_pair",
    "held_out_blocks",
    "parse_problem",
    "problems",
    "ranked_list",
    "render",
    "summarize",
    "wrong_offset",
]
