"""Build the demo task's JSONL files from a `DataConfig`: deterministic from `cfg.seed`, byte for byte.

Each file draws from its own random stream (seeded with the seed and the file's name), so changing the size of one
file leaves the others unchanged.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Any

from ..config import DataConfig
from ..data.contract import CONTRACT_FILES, FILE_NAMES
from ..data.records import read_pairs, read_ranked, read_sft, write_jsonl
from .adversarial import adversarial_pairs
from .judge import gold_score
from .responses import BROAD_MIX, SFT_MIX, ResponseSpec, sample_response
from .slots import parse_topic, prompts_for, split_combos, topics_of

EVAL_PAIR_MARGIN = 0.5  # gold(chosen) - gold(rejected) of held-out pairs: clear preferences, not coin flips
_LOOP = re.compile(r"\b(\w+)(?: \1\b)+")
_MAX_DRAWS = 10_000  # resampling guard; the response space is far larger than any list, so it is never reached



def _rng(seed: int, stream: str) -> random.Random:
    # A str seed is hashed with SHA-512 by `random`, so it is stable across processes and PYTHONHASHSEED.
    return random.Random(f"rlhf-demo-task:{seed}:{stream}")


def _draw_prompts(rng: random.Random, pool: list[str], n: int) -> list[str]:
    """`n` prompts: passes over a reshuffled pool, so every distinct prompt appears before any repeats."""
    out: list[str] = []
    while len(out) < n:
        order = list(pool)
        rng.shuffle(order)
        out.extend(order)
    return out[:n]


def _gumbel(rng: random.Random) -> float:
    u = min(max(rng.random(), 1e-12), 1.0 - 1e-12)  # keep both logs finite
    return -math.log(-math.log(u))


def _topic(prompt: str) -> str:
    topic = parse_topic(prompt)
    assert topic is not None, "demo prompts always name a topic"
    return topic


def topic_twin(rng: random.Random, spec: ResponseSpec, text: str, prompt_topic: str, split: str = "train") -> str:
    """`text` about another topic: its topic keyword swapped everywhere (intro and facts alike), all else the same.

    An on-topic response becomes off-topic (a random other topic), an off-topic one on-topic, so the two differ
    only in whether the response's keyword is the prompt's. A text cut before its keyword comes back unchanged.
    """
    other = rng.choice([t for t in topics_of(split) if t != prompt_topic]) if spec.on_topic else prompt_topic
    return re.sub(rf"\b{spec.topic}\b", other, text)


def loop_twin(text: str) -> str:
    """`text` with each word caught in a loop said once: "Join a a a local club." -> "Join a local club."."""
    return _LOOP.sub(r"\1", text)


def ranked_list(rng: random.Random, prompt: str, k: int, noise: float, twins: int = 0,
                loop_twins: int = 0, split: str = "train") -> dict[str, Any]:
    """K distinct responses in generation order, ranked best first by gold score + `noise` x Gumbel.

    The first 2 x `twins` responses are minimal pairs, a response then its `topic_twin`; the next 2 x `loop_twins`
    are a response with a looped word then its `loop_twin`; the rest are drawn alone. All from the topics and
    templates of `split`.
    Sorting Gumbel-perturbed scores samples a Plackett-Luce ranking with weights exp(gold / noise); each pair's
    marginal is Bradley-Terry, P(i above j) = sigmoid((gold_i - gold_j) / noise). noise = 0 gives the gold order
    (ties broken by position).
    """
    if 2 * (twins + loop_twins) > k:
        raise ValueError(f"{twins} topic and {loop_twins} loop twins (2 responses each) do not fit in a list of {k}")
    topic = _topic(prompt)
    responses: list[str] = []
    draws = 0
    while len(responses) < k:
        draws += 1
        if draws > _MAX_DRAWS:
            raise RuntimeError(f"could not draw {k} distinct responses")
        if len(responses) < 2 * twins:
            spec, text = sample_response(rng, BROAD_MIX, topic, split)
            new = [text, topic_twin(rng, spec, text, topic, split)]
        elif len(responses) < 2 * (twins + loop_twins):
            _, text = sample_response(rng, replace(BROAD_MIX, repeat=1.0), topic, split)
            new = [text, loop_twin(text)]
        else:
            new = [sample_response(rng, BROAD_MIX, topic, split)[1]]
        # Identical responses would be ties the labeller cannot order (and a text without its keyword has no twin).
        if len(set(new)) == len(new) and not set(new) & set(responses):
            responses.extend(new)
    noisy = [gold_score(prompt, r) + (noise * _gumbel(rng) if noise > 0 else 0.0) for r in responses]
    ranking = sorted(range(k), key=lambda i: (-noisy[i], i))
    return {"prompt": prompt, "responses": responses, "ranking": ranking}


def eval_pair(rng: random.Random, prompt: str, margin: float = EVAL_PAIR_MARGIN, split: str = "test") -> dict[str, str]:
    """A noise-free pair whose gold scores differ by at least `margin`."""
    topic = _topic(prompt)
    for _ in range(_MAX_DRAWS):
        (_, a), (_, b) = sample_response(rng, BROAD_MIX, topic, split), sample_response(rng, BROAD_MIX, topic, split)
        ga, gb = gold_score(prompt, a), gold_score(prompt, b)
        if abs(ga - gb) >= margin:
            chosen, rejected = (a, b) if ga > gb else (b, a)
            return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    raise RuntimeError(f"could not draw a pair with gold margin >= {margin}")


def build_demo_task(cfg: DataConfig, out_dir: str | Path) -> dict[str, Path]:
    """Write the demo task's JSONL files into `out_dir`; returns {"sft": path, "preferences": path, ...}.

    Training files come from the training split; `prompts_eval`, `eval_pairs` and `adversarial_pairs` from
    `cfg.heldout` (test, or validation while settings are chosen); `prompts_val` always holds the validation
    prompts, on which the eval stage picks the best constant reply.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed, held = cfg.seed, cfg.heldout
    train = _draw_prompts(_rng(seed, "prompts_train"), prompts_for(split_combos("train")), cfg.n_train_prompts)
    evals = _draw_prompts(_rng(seed, f"prompts_{held}"), prompts_for(split_combos(held)), cfg.n_eval_prompts)
    val = _draw_prompts(_rng(seed, "prompts_validation"), prompts_for(split_combos("validation")), cfg.n_eval_prompts)

    rng = _rng(seed, "sft")
    sft = [
        {"prompt": p, "response": sample_response(rng, SFT_MIX, _topic(p), "train")[1]}
        for p in train
        for _ in range(cfg.sft_per_prompt)
    ]
    rng = _rng(seed, "preferences")
    prefs = [
        ranked_list(rng, p, cfg.responses_per_list, cfg.rank_noise, cfg.topic_twins, cfg.loop_twins)
        for p in train
        for _ in range(cfg.ranked_per_prompt)
    ]
    rng = _rng(seed, f"{held}_pairs")
    pairs = [eval_pair(rng, p, split=held) for p in evals for _ in range(cfg.eval_pairs_per_prompt)]
    adversarial = adversarial_pairs(_rng(seed, f"{held}_adversarial"), sorted(set(evals)), held,
                                    cfg.adversarial_per_topic_pair, cfg.adversarial_per_kind)

    rows: dict[str, list[dict[str, Any]]] = {
        "sft": sft,
        "preferences": prefs,
        "prompts_train": [{"prompt": p} for p in train],
        "prompts_eval": [{"prompt": p} for p in evals],
        "eval_pairs": pairs,
        "prompts_val": [{"prompt": p} for p in val],
        "adversarial_pairs": adversarial,
    }
    return {key: write_jsonl(out / FILE_NAMES[key], rows[key]) for key in rows}


def summarize(paths: dict[str, Path]) -> dict[str, float]:
    """Gold-score statistics of built files (for the README and sanity checks).

    Keys: mean gold of SFT demos; of the top-ranked, bottom-ranked and all responses of ranked lists; of eval
    pairs' chosen and rejected; and `label_agreement`, the fraction of (untied) pairs implied by the rankings whose
    order agrees with the gold score (1.0 when rank_noise = 0).
    """
    sft = read_sft(paths["sft"]).rows
    ranked = read_ranked(paths["preferences"]).rows
    pairs = read_pairs(paths["eval_pairs"]).rows
    agree = total = 0
    for ex in ranked:
        scores = [gold_score(ex.prompt, r) for r in ex.responses]  # best first
        for i in range(len(scores)):
            for j in range(i + 1, len(scores)):
                if scores[i] != scores[j]:
                    total += 1
                    agree += scores[i] > scores[j]
    return {
        "sft_mean_gold": fmean(gold_score(e.prompt, e.response) for e in sft),
        "ranked_best_mean_gold": fmean(gold_score(e.prompt, e.responses[0]) for e in ranked),
        "ranked_worst_mean_gold": fmean(gold_score(e.prompt, e.responses[-1]) for e in ranked),
        "ranked_all_mean_gold": fmean(gold_score(e.prompt, r) for e in ranked for r in e.responses),
        "eval_chosen_mean_gold": fmean(gold_score(e.prompt, e.chosen) for e in pairs),
        "eval_rejected_mean_gold": fmean(gold_score(e.prompt, e.rejected) for e in pairs),
        "label_agreement": agree / total if total else 1.0,
    }
