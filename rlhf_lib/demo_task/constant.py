"""The best constant reply of the demo task: one fixed answer, only its topic keyword filled from the prompt, picked
by the reward model on validation prompts and judged by gold on the eval prompts (docs/data.md, "Baselines").

If a template beats PPO, the policy learned less than a lookup table would: the baseline the demo has to clear.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations, product

from .responses import CLOSINGS, INTROS, NEUTRAL_OPENERS, POLITE_OPENERS, RUDE_OPENERS
from .slots import FACT_TEMPLATES, HELDOUT_FACT_TEMPLATES, parse_topic

Scorer = Callable[[list[str], list[str]], Sequence[float]]  # (prompts, responses) -> one score each


def constant_candidates() -> list[str]:
    """Reply templates with a `{k}` slot, from training templates only: no opener or one of each tone's first two,
    an intro or not, any subset of the training facts (in template order), no closing or any closing: 1,119."""
    openers = ("", *POLITE_OPENERS[:2], *NEUTRAL_OPENERS[1:3], *RUDE_OPENERS[:2])
    facts = [t for t in FACT_TEMPLATES if t not in HELDOUT_FACT_TEMPLATES]
    subsets = [c for n in range(len(facts) + 1) for c in combinations(facts, n)]
    out = []
    for opener, intro, chosen, closing in product(openers, ("", INTROS[0]), subsets, ("", *CLOSINGS)):
        parts = [p for p in (opener, intro, *chosen, closing) if p]
        if parts:
            out.append(" " + " ".join(parts))
    return out


def fill(template: str, prompt: str) -> str:
    """The reply `template` for `prompt`: its topic keyword in the `{k}` slot."""
    return template.replace("{k}", parse_topic(prompt) or "it")


def best_constant(score: Scorer, prompts: Sequence[str], candidates: Sequence[str] | None = None) -> tuple[str, float]:
    """The candidate with the highest mean score over `prompts` (the first on ties) and that mean."""
    candidates = list(candidates if candidates is not None else constant_candidates())
    rows = [(p, fill(c, p)) for c in candidates for p in prompts]
    scores = list(score([p for p, _ in rows], [r for _, r in rows]))
    n = len(prompts)
    means = [sum(scores[i * n:(i + 1) * n]) / n for i in range(len(candidates))]
    best = max(range(len(candidates)), key=lambda i: (means[i], -i))
    return candidates[best], means[best]
