"""The reward model's baselines (rlhf_lib/baselines.py): hand-computed verdicts, leads and log-probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhf_lib.baselines import (
    Verdicts,
    baseline_rows,
    edge_verdict,
    linear_probe,
    mean_logprobs,
    ngram_regression,
    prefer_shorter,
    training_pairs,
    zero_shot_loglik,
)
from rlhf_lib.data.collate import encode_prompt_response
from rlhf_lib.data.records import PairExample, RankedExample


def test_training_pairs_are_every_pair_of_each_list_best_first():
    lists = [RankedExample("p", ("a", "b", "c")), RankedExample("q", ("x", "y"))]
    got = [(p.prompt, p.chosen, p.rejected) for p in training_pairs(lists)]
    assert got == [("p", "a", "b"), ("p", "a", "c"), ("p", "b", "c"), ("q", "x", "y")]
    assert len(training_pairs(lists, limit=2, seed=0)) == 2
    assert training_pairs(lists, limit=2, seed=0) == training_pairs(lists, limit=2, seed=0)


def test_prefer_shorter_counts_a_tie_as_wrong():
    pairs = [PairExample("p", "ab", "abc"), PairExample("p", "abcd", "ab"), PairExample("p", "ab", "cd")]
    assert prefer_shorter(pairs).right.tolist() == [True, False, False]


def test_baseline_rows_hand_computed():
    rm = np.array([True, True, False, True])
    rows = baseline_rows(rm, [Verdicts("shorter", np.array([True, False, False, False]))])
    (row,) = rows
    assert row["name"] == "prefer shorter" and row["pairs"] == 4 and row["accuracy"] == 0.25
    assert row["rm_lead"] == pytest.approx(0.5)  # per pair: 0, +1, 0, +1
    lo, hi = row["rm_lead_ci95"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0
    ci = row["ci95"]
    assert ci[0] < 0.25 < ci[1]


def test_edge_verdict_needs_a_strictly_higher_accuracy():
    rows = baseline_rows(np.array([True, False]), [Verdicts("loglik", np.array([True, False]))])
    beats, text = edge_verdict(0.5, rows)
    assert not beats and "zero-shot log-likelihood 0.500" in text and "lead +0.000" in text
    beats, _ = edge_verdict(0.75, rows)
    assert beats
    assert edge_verdict(0.5, [])[0]  # nothing to beat


def test_ngram_regression_learns_a_word_and_generalises():
    good = ["great answer here", "a great reply", "great stuff", "really great", "great work"]
    bad = ["poor answer here", "a poor reply", "poor stuff", "really poor", "poor work"]
    train = [PairExample("p", g, b) for g in good for b in bad[:3]] + [PairExample("p", g, b) for g in good[:2]
                                                                        for b in bad]
    held = [PairExample("q", "great idea", "poor idea"), PairExample("q", "poor plan", "great plan")]
    v = ngram_regression(train, held)
    assert v.right.tolist() == [True, False]  # the second pair's chosen says "poor": the model says rejected
    assert "training pairs" in v.detail


def test_mean_logprobs_match_a_hand_computation(tiny_tokenizer, tiny_policy):
    tok, model = tiny_tokenizer, tiny_policy.eval()
    prompt, response = "\n\nHuman: tell me about topic 3\n\nAssistant:", " Sure, topic 3 is nice."
    ids, n_prompt = encode_prompt_response(tok, prompt, response, 64)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    by_hand = np.mean([logp[t - 1, ids[t]].item() for t in range(n_prompt, len(ids))])  # response tokens + EOS
    got = mean_logprobs(model, tok, [(prompt, response), (prompt, " Thanks!")], 64, batch_size=2)
    assert got[0] == pytest.approx(by_hand, abs=1e-5)
    alone = mean_logprobs(model, tok, [(prompt, " Thanks!")], 64)
    assert got[1] == pytest.approx(alone[0], abs=1e-5)  # padding in the batch changes nothing


def test_zero_shot_loglik_prefers_what_the_model_finds_likely(tiny_tokenizer, tiny_policy):
    p = "\n\nHuman: tell me about topic 3\n\nAssistant:"
    pairs = [PairExample(p, " Sure, topic 3 is nice.", " zq zq zq"), PairExample(p, " zq zq zq", " Sure, topic 3.")]
    lp = mean_logprobs(tiny_policy, tiny_tokenizer, [(p, " Sure, topic 3 is nice."), (p, " zq zq zq")], 64)
    v = zero_shot_loglik(tiny_policy, tiny_tokenizer, pairs, 64)
    assert v.right[0] == (lp[0] > lp[1])


def test_linear_probe_separates_an_easy_signal(tiny_tokenizer, tiny_policy):
    # chosen ends with "Thanks!", rejected with "nice.": the last-token features tell them apart
    p = "\n\nHuman: tell me about topic {}\n\nAssistant:"
    train = [PairExample(p.format(i), f" Sure, topic {i}. Thanks!", f" Sure, topic {i} is nice.") for i in range(24)]
    held = [PairExample(p.format(i), f" Sure, topic {i}. Thanks!", f" Sure, topic {i} is nice.") for i in range(30, 36)]
    v = linear_probe(tiny_policy, tiny_tokenizer, train, held, 64, batch_size=8)
    assert v.right.all() and "32 features" in v.detail


def test_the_pairwise_fit_takes_newton_steps_on_many_dense_rows_of_few_features():
    """Dense rows >= 10x their features: Newton-Cholesky, whose optimum lbfgs reaches too at a tight tolerance;
    sparse n-gram counts and wide features: lbfgs."""
    import numpy as np
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression

    from rlhf_lib.baselines import _pairwise_fit, pairwise_solver

    assert pairwise_solver(np.zeros((320, 32))) == "newton-cholesky"
    assert pairwise_solver(np.zeros((319, 32))) == "lbfgs" and pairwise_solver(sparse.csr_matrix((900, 3))) == "lbfgs"
    rng = np.random.default_rng(0)
    diff = rng.normal(size=(200, 4)) + np.array([1.0, 0.0, 0.0, 0.0])
    model = _pairwise_fit(diff, seed=0)
    x, y = np.concatenate([diff, -diff]), np.r_[np.ones(200), np.zeros(200)]
    exact = LogisticRegression(C=float(model.C_), fit_intercept=False, tol=1e-10, max_iter=10000).fit(x, y)
    assert np.allclose(model.coef_, exact.coef_, atol=1e-4) and model.coef_[0, 0] > 0
