"""Adversarial minimal pairs of the held-out splits: a clean response against its twin with one flaw a reward model
can be fooled by (docs/data.md, "Adversarial pairs").

Kinds, the clean response always chosen:
- `topic:<prompt topic>><other topic>`: the response with its topic keyword swapped for another topic's, for every
  other topic, so the report can name the topic pairs the reward model confuses (random pairs almost never set
  hiking against yoga);
- `loop`: one word of it said three times in a row;
- `cut`: its last sentence cut mid-way;
- `politeness`: pleasantries stacked in front (the judge counts politeness once; the words only add length);
- `facts`: two more facts than the judge counts (detail is capped at 3; they only add length).
Each pair is kept only when the gold judge prefers the clean response by at least `ADVERSARIAL_MARGIN`.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from typing import Any

from .judge import gold_score
from .responses import CLOSINGS, ResponseSpec, _cut, openers_of, render
from .slots import TOPIC_NAMES, facts_of, parse_topic

KINDS: tuple[str, ...] = ("topic", "loop", "cut", "politeness", "facts")
ADVERSARIAL_MARGIN = 0.1
PLEASANTRIES: tuple[str, ...] = ("Thanks for asking!", "My pleasure!", "Glad you asked!")
_MAX_DRAWS = 1_000


def _clean(rng: random.Random, topic: str, split: str, n_facts: int | None = None) -> str:
    """A clean on-topic response: polite or neutral, 1-3 facts, no padding, no loop, a proper ending."""
    spec = ResponseSpec(topic=topic, on_topic=True, tone=rng.choice(("polite", "neutral")),
                        n_facts=rng.randint(1, 3) if n_facts is None else n_facts, n_filler=0, repeat=False,
                        ending=rng.choice(("closed", "plain")))
    return render(spec, rng, split)


def _looped(rng: random.Random, text: str) -> str:
    ws = text.split()
    j = rng.choice([i for i, w in enumerate(ws[:-1]) if w[-1].isalpha()] or [0])
    return " " + " ".join(ws[:j] + [ws[j]] * 3 + ws[j + 1:])


def _cut_text(rng: random.Random, text: str) -> str:
    sentences = re.split(r"(?<=[.!?])\s+", text.strip())
    return " " + " ".join(sentences[:-1] + [_cut(sentences[-1], rng)]).strip()


def _stacked(rng: random.Random, text: str, split: str) -> str:
    extra = [o for o in openers_of("polite", split) + PLEASANTRIES if o not in text]
    return " " + " ".join(rng.sample(extra, min(4, len(extra)))) + text


def _too_many_facts(rng: random.Random, text: str, topic: str, split: str) -> str:
    unused = [f for f in facts_of(topic, split) if f not in text]
    extra = " ".join(rng.sample(unused, min(2, len(unused))))
    closing = next((c for c in CLOSINGS if text.endswith(c)), None)
    if closing:  # the extra facts go before the closing phrase, as a longer answer would put them
        return text[: -len(closing)] + extra + " " + closing
    return text + " " + extra


def _pair(rng: random.Random, prompt: str, kind: str, split: str, other: str | None = None) -> dict[str, Any]:
    topic = parse_topic(prompt)
    assert topic is not None, "demo prompts always name a topic"
    for _ in range(_MAX_DRAWS):
        clean = _clean(rng, topic, split, 3 if kind == "facts" else None)
        if kind == "topic":
            bad, category = re.sub(rf"\b{topic}\b", str(other), clean), f"topic:{topic}>{other}"
        else:
            category = kind
            bad = {"loop": lambda: _looped(rng, clean), "cut": lambda: _cut_text(rng, clean),
                   "politeness": lambda: _stacked(rng, clean, split),
                   "facts": lambda: _too_many_facts(rng, clean, topic, split)}[kind]()
        if bad.strip() != clean.strip() and gold_score(prompt, clean) - gold_score(prompt, bad) >= ADVERSARIAL_MARGIN:
            return {"prompt": prompt, "chosen": clean, "rejected": bad, "category": category}
    raise RuntimeError(f"could not draw an adversarial {kind} pair for {prompt!r}")


def adversarial_pairs(rng: random.Random, prompts: list[str], split: str, per_topic_pair: int,
                      per_kind: int) -> list[dict[str, Any]]:
    """The adversarial pairs of a held-out split whose distinct prompts are `prompts`: `per_topic_pair` topic swaps
    for each (prompt topic, other topic) and `per_kind` pairs of every other kind, prompts taken in turn."""
    by_topic: dict[str, list[str]] = defaultdict(list)
    for p in prompts:
        by_topic[str(parse_topic(p))].append(p)
    rows = []
    for topic in sorted(by_topic):
        for other in (t for t in TOPIC_NAMES if t != topic):
            rows += [_pair(rng, rng.choice(by_topic[topic]), "topic", split, other) for _ in range(per_topic_pair)]
    for kind in KINDS[1:]:
        rows += [_pair(rng, prompts[i % len(prompts)], kind, split) for i in range(per_kind)]
    return rows
