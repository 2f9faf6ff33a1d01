"""The warning a stage logs when its max_length cuts training rows (a cut prompt loses its question on the left)."""

from __future__ import annotations

from rlhf_lib.data.collate import truncation_notice


def test_no_cut_no_notice_and_a_cut_names_the_key_and_counts():
    assert truncation_notice("sft", {"prompts": 0, "responses": 0}, 10, "sft.max_length", 96) is None
    text = truncation_notice("sft", {"prompts": 3, "responses": 1}, 10, "sft.max_length", 96)
    assert text.startswith("sft: at sft.max_length=96 tokens, 3 of 10 rows lose the start of their prompt and 1 ")
    assert "raise sft.max_length" in text
