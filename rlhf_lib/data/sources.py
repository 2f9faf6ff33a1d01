"""Where user rows come from: a local file, a local directory of data files, or a hub data set.

- `.jsonl` files are read line by line (`jsonl.py`): a malformed line, invalid UTF-8 or a wrong type is then a row
  error named by its line (`prefs.jsonl:2: invalid JSON`), where a whole-file loader would reject the file, or
  coerce mixed types to one column type and hide the bad row.
- `.json`, `.csv` and `.parquet` files go through `datasets` (its `json`, `csv` and `parquet` builders); their rows
  are named by number (`prefs.csv: row 2: ...`). A null cell counts as a missing field.
- Anything else is `datasets.load_dataset(name_or_dir, data_dir=..., split=..., revision=...)`: a directory of data
  files locally, or a hub data set (e.g. `Anthropic/hh-rlhf` with data_dir `harmless-base`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .fields import DataError
from .jsonl import jsonl_rows, read_bytes

BUILDERS = {".json": "json", ".csv": "csv", ".parquet": "parquet"}
DATA_SUFFIXES = (".jsonl", *BUILDERS)
# `datasets`' packaged builders: a name of these given to `load_dataset` reads local files (`text` with a data_dir
# reads every file of a folder), so it is never taken for a hub data set. The library's own list is private
# (`datasets.packaged_modules._PACKAGED_DATASETS_MODULES`, pinned by tests/rlhf_lib/data/test_sources.py); these are
# the names of datasets 4-5, kept in case it moves.
PACKAGED_BUILDERS = frozenset({"text", "json", "csv", "parquet", "arrow", "pandas", "sql", "xml", "webdataset",
                               "imagefolder", "audiofolder", "videofolder", "pdffolder", "niftifolder", "cache",
                               "generator", "spark", "hdf5", "eval", "lance", "iceberg", "conll", "fasta", "fastq",
                               "genbank", "harbor", "meshfolder", "mmcif", "pdb", "tsfile", "vortex"})


def is_builder_name(spec: str) -> bool:
    """Whether `spec` names one of `datasets`' packaged builders (a local-file reader), not a hub data set."""
    name = spec.strip().strip("/").lower()
    if name in PACKAGED_BUILDERS:
        return True
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:
        return False
    return name in _PACKAGED_DATASETS_MODULES
Rows = Iterator[tuple[int, "dict[str, Any] | DataError"]]
Kind = Literal["jsonl", "file", "dir", "hub"]


@dataclass(frozen=True)
class Source:
    """One configured source: `spec` is a path or hub name; split, data_dir and revision apply to `load_dataset`."""

    spec: str
    split: str = "train"
    data_dir: str | None = None
    revision: str | None = None

    @property
    def path(self) -> Path:
        return Path(self.spec).expanduser()

    @property
    def kind(self) -> Kind:
        """jsonl / file (a local file of a known type) / dir (a local directory) / hub (anything else)."""
        suffix = self.path.suffix.lower()
        if suffix == ".jsonl":
            return "jsonl"
        if suffix in BUILDERS:
            return "file"
        if self.path.is_dir():
            return "dir"
        if self.path.exists():
            raise DataError(f"{self.spec}: not a data source: expected a .jsonl, .json, .csv or .parquet file, a "
                            "directory of data files, or a hub data set name", path=self.spec, kind="unreadable")
        if self.spec.startswith(("/", ".", "~")):  # a path, not a hub name
            raise DataError(f"{self.spec}: file not found", path=self.spec, kind="missing file")
        if is_builder_name(self.spec):
            raise DataError(f"{self.spec}: no such file or directory, and a datasets builder name is not a hub data "
                            "set (name a file or directory of data files)", path=self.spec, kind="missing file")
        return "hub"

    @property
    def name(self) -> str:
        """A short name for logs and MLflow data sets: the file's stem or the data set's name."""
        return self.path.stem if self.kind in ("jsonl", "file") else self.spec.rstrip("/").split("/")[-1]


def _load_dataset(src: Source) -> Any:
    """The source as a `datasets.Dataset`. Local files and directories are converted in a temporary cache and kept
    in memory (nothing is left behind); hub data sets use the Hugging Face cache (`HF_DATASETS_CACHE`)."""
    import datasets

    datasets.disable_progress_bars()
    try:
        if src.kind == "hub":
            return datasets.load_dataset(src.spec, data_dir=src.data_dir, split=src.split, revision=src.revision)
        with tempfile.TemporaryDirectory(prefix="rlhf-datasets-") as tmp:
            if src.kind == "file":
                read_bytes(src.path)  # a missing file is named as such, not as a builder error
                return datasets.load_dataset(BUILDERS[src.path.suffix.lower()], data_files=str(src.path),
                                             split="train", cache_dir=tmp, keep_in_memory=True)
            return datasets.load_dataset(str(src.path), data_dir=src.data_dir, split=src.split, cache_dir=tmp,
                                         keep_in_memory=True)
    except DataError:
        raise
    except Exception as e:  # datasets raises many types (FileNotFoundError, DatasetGenerationError, hub errors)
        raise DataError(f"{src.spec}: cannot load it with datasets ({type(e).__name__}: {e})"[:600], path=src.spec,
                        kind="unreadable") from None


def source_rows(src: Source) -> tuple[Rows, Callable[[int], str]]:
    """The numbered rows of a source, and how to name the place of row n in an error."""
    if src.kind == "jsonl":
        return jsonl_rows(src.path), lambda n: f"{src.spec}:{n}"
    ds = _load_dataset(src)
    rows = ((i, {k: v for k, v in row.items() if v is not None}) for i, row in enumerate(ds, start=1))
    return rows, lambda n: f"{src.spec}: row {n}"


def hub_fingerprint(src: Source) -> str:
    """`datasets`' own fingerprint of a hub data set (it follows the resolved data files and revision, so a new
    version of the data set gives a new fingerprint)."""
    return str(_load_dataset(src)._fingerprint)
