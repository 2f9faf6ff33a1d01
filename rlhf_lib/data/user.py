"""User data -> the pipeline's five files (the same ones the demo task builds): every source read in its format,
held-out data split off, and what the user did not give derived from the preferences.

- eval pairs (RM accuracy) and eval prompts: `data.eval_preferences` (e.g. the data set's test split), else a seeded
  `data.eval_fraction` of the distinct preference prompts with all their rows; eval prompts are `data.eval_prompts`,
  else the held-out prompts. A held-out prompt never appears in training data: rows that share one are dropped
  (and counted).
- SFT demonstrations: `data.sft`, else (prompt, best response) of each training preference.
- PPO prompts: `data.prompts`, else the distinct prompts of the training preferences.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

from rlhf_lib.config import DataConfig

from .chat import Renderer
from .checks import DataWarning, suspicious_rows
from .fields import DataError, Fields
from .formats import PARSERS, detect
from .records import PairExample, PromptExample, RankedExample, ReadResult, SFTExample, category, collect
from .sources import Source, source_rows


@dataclass
class SourceReport:
    """What reading one source found: its format, valid rows, and skipped rows by reason (first messages too)."""

    source: str
    format: str
    rows: int
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class UserTask:
    """The records of the five files (keys as the demo task's `FILE_NAMES`), and how they were obtained."""

    records: dict[str, list[Any]]
    sources: dict[str, SourceReport]
    dropped: dict[str, int]  # training rows dropped because their prompt is held out, per file
    rendering: str | None  # "chat_template" / "hh" when conversational rows were rendered, else None


def read_source(kind: str, src: Source, fmt: str, mapping: Mapping[str, str], renderer: Renderer,
                on_bad_row: str, max_chars: int, max_rows: int | None = None, skip_rows: int = 0,
                ) -> tuple[ReadResult[Any], str]:
    """Read a `kind` source ("preferences", "sft", "prompts") in format `fmt` ("auto" detects it on the first row
    that is an object; a source whose format cannot be told fails whatever `on_bad_row` says). `max_rows` keeps
    the first that many valid rows (the rows after them are not validated), after the first `skip_rows` valid rows,
    which are checked and left out."""
    rows, place = source_rows(src)
    head: list[tuple[int, Any]] = []
    for n, obj in rows:
        head.append((n, obj))
        if isinstance(obj, dict):
            if fmt == "auto":
                try:
                    fmt = detect(kind, obj, mapping)
                except DataError as e:
                    raise DataError(f"{place(n)}: {e}", path=src.spec, line=n, kind=e.kind) from None
            break
    parse = PARSERS[kind]
    lines: list[int] = []  # the line (row number) of each parsed record, in order
    current = [0]

    def numbered(items):
        for n, obj in items:
            current[0] = n
            yield n, obj

    def parse_row(obj: dict[str, Any]) -> Any:
        fields = Fields(obj, mapping)
        record = parse(fmt, fields, renderer)
        lines.append(current[0])
        # A preference row's optional category (RewardBench's layout) rides along for the RM report.
        return replace(record, category=cat) if kind == "preferences" and (cat := category(fields)) else record

    result = collect(numbered(chain(head, rows)), parse_row, on_bad_row,  # type: ignore[arg-type]
                     max_chars, src.spec, place, max_rows, skip_rows)
    del lines[:len(lines) - len(result.rows)]  # the skipped rows came first
    return _checked(kind, result, lines, on_bad_row, src.spec, place), fmt


def _checked(kind: str, result: ReadResult[Any], lines: list[int], on_bad_row: str, spec: str,
             place) -> ReadResult[Any]:
    """`result` after `checks.suspicious_rows`: a `DataWarning` naming each reason's count and first row; with
    on_bad_row=skip those rows are dropped and counted in `skipped`."""
    import warnings

    line_of = {id(r): n for r, n in zip(result.rows, lines)} if len(lines) == len(result.rows) else {}
    found = suspicious_rows(kind, result.rows)
    if not found:
        return result
    parts = [f"{len(idx)} {reason} row(s) (first: {place(line_of.get(id(result.rows[idx[0]]), idx[0] + 1))})"
             for reason, idx in found.items()]
    skip = on_bad_row == "skip"
    warnings.warn(f"{spec}: {', '.join(parts)}; " + ("dropped (data.on_bad_row=skip)" if skip
                                                      else "kept; data.on_bad_row=skip drops them"),
                  DataWarning, stacklevel=2)
    if not skip:
        return result
    drop = {i for idx in found.values() for i in idx}
    skipped = dict(result.skipped)
    examples = {k: list(v) for k, v in result.examples.items()}
    for reason, idx in found.items():
        skipped[reason] = skipped.get(reason, 0) + len(idx)
        examples.setdefault(reason, []).extend(
            f"{place(line_of.get(id(result.rows[i]), i + 1))}: {reason}" for i in idx[:3])
    return replace(result, rows=[r for i, r in enumerate(result.rows) if i not in drop], skipped=skipped,
                   examples=examples)


def split_heldout(lists: list[RankedExample], fraction: float, seed: int) -> tuple[list[RankedExample],
                                                                                    list[RankedExample]]:
    """(train, held out): a seeded `fraction` of the distinct prompts (at least one, never all) with all their
    lists. Prompts are sorted before the shuffle, so the split does not depend on row order."""
    prompts = sorted({ex.prompt for ex in lists})
    if len(prompts) < 2:
        raise DataError(f"the preference data has {len(prompts)} distinct prompt(s); holding some out for eval "
                        "needs at least 2 (or set data.eval_preferences)", kind="no rows")
    random.Random(f"rlhf-eval-split:{seed}").shuffle(prompts)
    held = set(prompts[: min(len(prompts) - 1, max(1, round(fraction * len(prompts))))])
    return [ex for ex in lists if ex.prompt not in held], [ex for ex in lists if ex.prompt in held]


def pairs_of(lists: Iterable[RankedExample]) -> list[PairExample]:
    """Every (better, worse) pair of every ranked list: K(K-1)/2 per list."""
    return [PairExample(ex.prompt, ex.responses[i], ex.responses[j], ex.category)
            for ex in lists for i in range(len(ex.responses)) for j in range(i + 1, len(ex.responses))]


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def build_user_task(cfg: DataConfig, renderer: Renderer) -> UserTask:
    """Read and validate every configured source; raises `DataError` on the first bad row (on_bad_row="error"),
    or on a source, split or derived file left without rows."""
    sources: dict[str, SourceReport] = {}

    def read(key: str, kind: str, split: str, fmt: str, mapping: Mapping[str, str]) -> list[Any]:
        src = Source(getattr(cfg, key), split, cfg.hub_data_dir, cfg.hub_revision)
        held_out = key.startswith("eval_")
        skip = 0 if held_out else cfg.skip_rows  # held-out sources always from their start
        caps = [cfg.max_rows] + ([] if held_out else [cfg.max_train_rows])
        cap = min((c for c in caps if c is not None), default=None)
        result, found = read_source(kind, src, fmt, mapping, renderer, cfg.on_bad_row, cfg.max_row_chars, cap, skip)
        sources[key] = SourceReport(src.spec, found, len(result.rows), result.skipped, result.examples)
        return result.rows

    if cfg.render == "chat_template":
        renderer.templated()  # refuses now, naming the key, when the policy has no template

    prefs = read("preferences", "preferences", cfg.split, cfg.preferences_format, cfg.preferences_columns)
    if cfg.eval_preferences:
        train = prefs
        held = read("eval_preferences", "preferences", cfg.eval_split, cfg.preferences_format,
                    cfg.preferences_columns)
    else:
        train, held = split_heldout(prefs, cfg.eval_fraction, cfg.seed)
    eval_prompts = (_unique(p.prompt for p in read("eval_prompts", "prompts", cfg.eval_split, "auto",
                                                   cfg.prompts_columns))
                    if cfg.eval_prompts else _unique(ex.prompt for ex in held))
    sft = (read("sft", "sft", cfg.split, cfg.sft_format, cfg.sft_columns) if cfg.sft
           else [SFTExample(ex.prompt, ex.responses[0]) for ex in train])
    prompts = (_unique(p.prompt for p in read("prompts", "prompts", cfg.split, "auto", cfg.prompts_columns))
               if cfg.prompts else _unique(ex.prompt for ex in train))

    heldout = set(eval_prompts) | {ex.prompt for ex in held}
    records: dict[str, list[Any]] = {
        "sft": [ex for ex in sft if ex.prompt not in heldout],
        "preferences": [ex for ex in train if ex.prompt not in heldout],
        "prompts_train": [PromptExample(p) for p in prompts if p not in heldout],
        "prompts_eval": [PromptExample(p) for p in eval_prompts],
        "eval_pairs": pairs_of(held),
    }
    before = {"sft": len(sft), "preferences": len(train), "prompts_train": len(prompts)}
    dropped = {k: n - len(records[k]) for k, n in before.items()}
    for key, rows in records.items():
        if not rows:
            raise DataError(f"no {key} rows left after holding out the eval prompts (dropped {dropped.get(key, 0)} "
                            "that share a held-out prompt)", kind="no rows")
    return UserTask(records, sources, dropped, renderer.used)
