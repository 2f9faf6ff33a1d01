"""Truncation: prompts lose tokens on the left, responses on the right, and the counts match what is cut."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_lib.data.collate import cuts, encode_prompt_response, prompt_truncations, truncation_counts


@pytest.mark.parametrize(("n_p", "n_r", "max_len", "expected"), [
    (3, 2, 8, (0, 0)),    # fits
    (10, 4, 8, (6, 0)),   # 6 over: the prompt gives 6, keeping 4 = 8 // 2
    (10, 8, 8, (6, 4)),   # 10 over: the prompt gives 6 (down to 4), the response the other 4
    (2, 12, 8, (0, 6)),   # a short prompt is never cut; the response loses 6 on the right
])
def test_cuts_hand_cases(n_p, n_r, max_len, expected):
    assert cuts(n_p, n_r, max_len) == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.text("ab cd", min_size=1, max_size=40), st.text("xy z", min_size=1, max_size=40)),
                min_size=1, max_size=6), st.integers(6, 30))
def test_counts_match_what_encoding_cuts(tiny_tokenizer, rows, max_length):
    prompts, responses = [p for p, _ in rows], [r for _, r in rows]
    cut_p = cut_r = 0
    for p, r in rows:
        ids, n_prompt = encode_prompt_response(tiny_tokenizer, p, r, max_length)
        full_p = len(tiny_tokenizer(p, add_special_tokens=False)["input_ids"])
        full_r = len(tiny_tokenizer(r, add_special_tokens=False)["input_ids"]) + 1  # + EOS
        cut_p += n_prompt < full_p
        cut_r += len(ids) - n_prompt < full_r
        assert len(ids) <= max_length and ids[-1] == tiny_tokenizer.eos_token_id
    assert truncation_counts(tiny_tokenizer, prompts, responses, max_length) == {"prompts": cut_p, "responses": cut_r}


def test_prompt_truncations(tiny_tokenizer):
    lengths = [len(tiny_tokenizer(p, add_special_tokens=False)["input_ids"]) for p in ("hi", "tell me about topic 7")]
    assert prompt_truncations(tiny_tokenizer, ["hi", "tell me about topic 7"], max(lengths) - 1) == 1
    assert prompt_truncations(tiny_tokenizer, ["hi", "tell me about topic 7"], max(lengths)) == 0
