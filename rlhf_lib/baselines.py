"""Cheap baselines a reward model must beat, scored on the same held-out pairs as the model (issue: learning is
claimed only against baselines). Each baseline gives every pair a verdict, chosen over rejected or not; a tie counts
as wrong, as it does for the reward model (`rlhf_lib.reward_report`).

- `prefer shorter`: the shorter response (in characters) wins. On real preference data length is the cue a reward
  model learns first; one that cannot beat it has learned little else.
- `zero-shot log-likelihood`: the response the policy (the SFT model, before any reward training) finds more likely,
  by its mean log-probability per token (EOS included). What the policy prefers already, with no labels at all.
- `n-gram logistic regression`: a logistic regression on bag-of-n-grams (words, 1-2) of the response, fit on the
  training pairs (every pair of each ranked list): difference of the two responses' counts -> which one won. A
  linear model of the words, the classic text-classification baseline.
- `linear probe`: a logistic regression on the frozen base model's last-token hidden state (the features the
  reward model's head reads before any fine-tuning), fit on training pairs the same way. What fine-tuning the
  backbone must beat: the part of the reward model that a linear head alone gets.

Both regressions choose their L2 strength by cross-validation on the training pairs (`LogisticRegressionCV`), never
on the held-out pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlhf_lib.data.collate import encode_prompt_response, pad_right
from rlhf_lib.data.records import PairExample, RankedExample
from rlhf_lib.devices import module_device
from rlhf_lib.intervals import mean_interval, proportion_interval
from rlhf_lib.lm.scoring import backbone_hidden, last_token_index

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Metric keys (reward/baseline/<key>_accuracy) and report names.
NAMES = {"shorter": "prefer shorter", "loglik": "zero-shot log-likelihood", "ngram": "n-gram logistic regression",
         "probe": "linear probe (frozen base model)"}
CS = (0.01, 0.1, 1.0, 10.0, 100.0)  # the L2 strengths cross-validated on the training pairs


@dataclass(frozen=True)
class Verdicts:
    """Which held-out pairs a baseline gets right (True: chosen scored above rejected)."""

    key: str
    right: np.ndarray  # (N,) bool
    detail: str = ""


def training_pairs(lists: Sequence[RankedExample], limit: int | None = None, seed: int = 0) -> list[PairExample]:
    """Every pair (better, worse) of each ranked list; at most `limit` of them, drawn with `seed`."""
    pairs = [PairExample(e.prompt, e.responses[i], e.responses[j], e.category)
             for e in lists for i in range(len(e.responses)) for j in range(i + 1, len(e.responses))]
    if limit is not None and len(pairs) > limit:
        keep = np.random.default_rng(seed).choice(len(pairs), size=limit, replace=False)
        pairs = [pairs[i] for i in sorted(keep)]
    return pairs


def prefer_shorter(pairs: Sequence[PairExample]) -> Verdicts:
    return Verdicts("shorter", np.array([len(p.chosen) < len(p.rejected) for p in pairs], dtype=bool))


def pairwise_solver(x) -> str:
    """The solver of `_pairwise_fit` for rows `x`: Newton-Cholesky for dense rows at least ten times as many as their
    features (scikit-learn's advice for n_samples >> n_features: a few exact Newton steps, where lbfgs crawls on the
    collinear last-token features of a small model, 254 iterations against 4 on the micro preset's probe), else
    lbfgs (sparse n-gram counts; a probe on a wide model's features)."""
    from scipy import sparse

    return "newton-cholesky" if not sparse.issparse(x) and x.shape[0] >= 10 * x.shape[1] else "lbfgs"


def _pairwise_fit(train_diff, seed: int):
    """A logistic regression on pair differences, both orders (x_c - x_r -> 1, x_r - x_c -> 0), no intercept (a
    pair's verdict must not depend on which response is called first); its C by 5-fold CV on these pairs."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegressionCV

    # Sparse n-gram counts stay sparse: lbfgs on them gives the same fit 7x faster than on the dense array.
    both = [train_diff, -train_diff]
    x = sparse.vstack(both) if sparse.issparse(train_diff) else np.concatenate(both)
    y = np.concatenate([np.ones(train_diff.shape[0]), np.zeros(train_diff.shape[0])])
    # L2 only, CV by accuracy and the scalar fitted attributes: scikit-learn 1.9's defaults said out loud, before
    # 1.10 and 1.11 change them (each default warns until set).
    model = LogisticRegressionCV(Cs=list(CS), cv=5, fit_intercept=False, max_iter=2000, random_state=seed,
                                 solver=pairwise_solver(x), l1_ratios=(0.0,), scoring="accuracy",
                                 use_legacy_attributes=False)
    return model.fit(x, y)


def ngram_model(train: Sequence[PairExample], seed: int = 0) -> Callable[[Sequence[PairExample]], Verdicts]:
    """The bag-of-n-grams logistic regression fit on `train`: a function that judges any pairs with it."""
    from sklearn.feature_extraction.text import CountVectorizer

    vec = CountVectorizer(ngram_range=(1, 2), lowercase=True, min_df=2 if len(train) >= 50 else 1)
    vec.fit([p.chosen for p in train] + [p.rejected for p in train])

    def diff(ps: Sequence[PairExample]):
        return vec.transform([p.chosen for p in ps]) - vec.transform([p.rejected for p in ps])

    model = _pairwise_fit(diff(train), seed)
    detail = f"C = {float(np.ravel(model.C_)[0]):g}, {len(vec.vocabulary_):,} n-grams, {len(train):,} training pairs"

    def judge(pairs: Sequence[PairExample]) -> Verdicts:
        return Verdicts("ngram", np.asarray(diff(pairs) @ model.coef_.ravel()).ravel() > 0, detail)
    return judge


def ngram_regression(train: Sequence[PairExample], pairs: Sequence[PairExample], seed: int = 0) -> Verdicts:
    """The bag-of-n-grams logistic regression, fit on `train`, judged on `pairs`."""
    return ngram_model(train, seed)(pairs)


def _batches(n: int, size: int):
    for i in range(0, n, size):
        yield slice(i, min(i + size, n))


@torch.inference_mode()
def mean_logprobs(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[tuple[str, str]],
                  max_length: int, batch_size: int = 16) -> np.ndarray:
    """Mean log-probability per response token (EOS included) of each (prompt, response) under the causal LM.
    Rows are cut as training cuts them (`encode_prompt_response`). Shape: (N,)."""
    device = module_device(model)
    encoded = [encode_prompt_response(tokenizer, p, r, max_length) for p, r in rows]
    out = np.zeros(len(rows))
    for sl in _batches(len(rows), batch_size):
        ids, mask = pad_right([e[0] for e in encoded[sl]], tokenizer.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (B, T-1, V)
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
        positions = torch.arange(1, ids.shape[1], device=device)[None]  # token t is predicted at t-1
        starts = torch.tensor([e[1] for e in encoded[sl]], device=device)[:, None]
        response = (positions >= starts) & mask[:, 1:].bool()  # (B, T-1)
        out[sl] = ((logp * response).sum(1) / response.sum(1).clamp(min=1)).cpu().numpy()
    return out


def zero_shot_loglik(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PairExample],
                     max_length: int, batch_size: int = 16) -> Verdicts:
    c = mean_logprobs(model, tokenizer, [(p.prompt, p.chosen) for p in pairs], max_length, batch_size)
    r = mean_logprobs(model, tokenizer, [(p.prompt, p.rejected) for p in pairs], max_length, batch_size)
    return Verdicts("loglik", c > r)


@torch.inference_mode()
def last_token_features(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                        rows: Sequence[tuple[str, str]], max_length: int, batch_size: int = 16) -> np.ndarray:
    """The frozen model's last hidden state at each row's last real token (EOS), float32. Shape: (N, H)."""
    device = module_device(model)
    encoded = [encode_prompt_response(tokenizer, p, r, max_length)[0] for p, r in rows]
    feats = []
    for sl in _batches(len(rows), batch_size):
        ids, mask = (t.to(device) for t in pad_right(encoded[sl], tokenizer.pad_token_id))
        hidden = backbone_hidden(model, ids, mask)  # (B, T, H)
        feats.append(hidden[torch.arange(len(ids), device=device), last_token_index(mask)].float().cpu().numpy())
    return np.concatenate(feats) if feats else np.zeros((0, 0))


def linear_probe(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, train: Sequence[PairExample],
                 pairs: Sequence[PairExample], max_length: int, batch_size: int = 16, seed: int = 0) -> Verdicts:
    """The logistic regression on the frozen model's last-token features, fit on `train`, judged on `pairs`. The
    features are standardised by the training pairs' statistics (a probe's C then means the same across models)."""

    def diff(ps: Sequence[PairExample]) -> np.ndarray:
        c = last_token_features(model, tokenizer, [(p.prompt, p.chosen) for p in ps], max_length, batch_size)
        r = last_token_features(model, tokenizer, [(p.prompt, p.rejected) for p in ps], max_length, batch_size)
        return c - r

    train_diff, test_diff = diff(train), diff(pairs)
    scale = np.sqrt((train_diff ** 2).mean(0)) + 1e-6  # differences have mean ~0 by symmetry: scale only
    probe = _pairwise_fit(train_diff / scale, seed)
    margin = (test_diff / scale) @ probe.coef_.ravel()
    return Verdicts("probe", margin > 0, f"C = {float(np.ravel(probe.C_)[0]):g}, {train_diff.shape[1]} features, "
                    f"{len(train):,} training pairs")


def baseline_rows(rm_right: np.ndarray, verdicts: Sequence[Verdicts], seed: int = 0) -> list[dict[str, Any]]:
    """Each baseline's accuracy with its 95 % interval, and the reward model's lead over it on the same pairs with a
    paired bootstrap interval (pairs resampled together). JSON-able, in the order given."""
    rows = []
    for v in verdicts:
        n, k = int(v.right.size), int(v.right.sum())
        lead = rm_right.astype(float) - v.right.astype(float)  # per pair: +1, 0 or -1
        rows.append({"key": v.key, "name": NAMES[v.key], "pairs": n, "accuracy": k / n if n else float("nan"),
                     "ci95": list(proportion_interval(k, n)), "rm_lead": float(lead.mean()) if n else float("nan"),
                     "rm_lead_ci95": list(mean_interval(lead.tolist(), seed=seed)) if n else [float("nan")] * 2,
                     **({"detail": v.detail} if v.detail else {})})
    return rows


def edge_verdict(rm_accuracy: float, rows: Sequence[dict[str, Any]], against: str = "loglik") -> tuple[bool, str]:
    """Whether the reward model beats the `against` baseline (its accuracy strictly higher on the same pairs), and a
    sentence saying so with the lead's interval. True when that baseline was not computed (nothing to beat)."""
    row = next((r for r in rows if r["key"] == against), None)
    if row is None:
        return True, f"no {NAMES[against]} baseline was computed"
    lo, hi = row["rm_lead_ci95"]
    text = (f"reward model {rm_accuracy:.3f} against {row['name']} {row['accuracy']:.3f} on the same "
            f"{row['pairs']} held-out pairs: lead {row['rm_lead']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return rm_accuracy > row["accuracy"], text


def baseline_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The MLflow metrics of `baseline_rows`: each baseline's accuracy and the reward model's lead over it."""
    out: dict[str, float] = {}
    for r in rows:
        out[f"reward/baseline/{r['key']}_accuracy"] = r["accuracy"]
        out[f"reward/baseline/{r['key']}_lead"] = r["rm_lead"]
    return out
