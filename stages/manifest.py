"""Content identities of artifact directories: a `manifest.json` of each file's sha256, and the digest over it.

A stage's artifacts carry their manifest, so a cache hit can be checked for intactness and downstream cache keys
follow content, not names."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


MAX_DIGEST_BYTES = 256 * 2**30  # past this a folder is refused, not read (a model of a few billion params is ~20 GB)


def regular_files(path: Path) -> list[Path]:
    """The regular files under `path`, sorted (a symlink to a regular file counts; FIFOs, devices and sockets do
    not: reading one could block forever or never end)."""
    out = []
    for p in Path(path).rglob("*"):
        try:
            if stat.S_ISREG(p.stat().st_mode):
                out.append(p)
        except OSError:  # a dangling link, a file gone meanwhile
            continue
    return sorted(out)


def dir_digest(path: Path, max_bytes: int = MAX_DIGEST_BYTES) -> str:
    """sha256 over the relative paths and contents of every regular file under `path` (sorted): a content
    identity. A folder whose files add up to more than `max_bytes` is refused before any is read (ValueError)."""
    files = regular_files(path)
    total = sum(f.stat().st_size for f in files)
    if total > max_bytes:
        raise ValueError(f"{path}: {total / 2**30:.1f} GiB of files, over the {max_bytes / 2**30:.0f} GiB a content "
                         "digest reads; name a model or data folder, not a whole disk")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path)).encode())
        h.update(bytes.fromhex(file_sha256(f)))
    return h.hexdigest()


def manifest_digest(files: dict[str, str]) -> str:
    """The content identity of an artifact directory: sha256 over its manifest (relative path -> file sha256)."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def write_manifest(local_dir: Path) -> str:
    """Write `manifest.json` (sha256 of each file) into `local_dir`; return the digest of the whole dir."""
    files = {str(p.relative_to(local_dir)): file_sha256(p)
             for p in sorted(local_dir.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (local_dir / "manifest.json").write_text(json.dumps(files, indent=1, sort_keys=True))
    return manifest_digest(files)


def read_manifest(local_dir: Path) -> dict[str, str] | None:
    try:
        return json.loads((Path(local_dir) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def verify_manifest(local_dir: Path, digest: str) -> bool:
    """True when every file listed in the manifest is present and intact, and the manifest matches `digest`."""
    files = read_manifest(local_dir)
    if files is None or manifest_digest(files) != digest:
        return False
    return all((p := local_dir / rel).is_file() and file_sha256(p) == sha for rel, sha in files.items())


def content_digest(local_dir: Path) -> str:
    """The identity of an artifact dir: the digest of its manifest, or of its files when it has none (a model
    logged by another tool)."""
    files = read_manifest(local_dir)
    return manifest_digest(files) if files is not None else dir_digest(local_dir)


def verify_digest(local_dir: Path, digest: str) -> bool:
    """True when the files under `local_dir` have the identity `digest` (see `content_digest`): checked once, when
    they are downloaded."""
    if read_manifest(local_dir) is not None:
        return verify_manifest(local_dir, digest)
    return dir_digest(local_dir) == digest
