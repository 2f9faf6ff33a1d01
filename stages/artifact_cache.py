"""The one way artifacts reach this machine: a local cache under `<state>/artifact-cache/`, so that each MLflow
artifact is downloaded at most once per machine, and nothing is downloaded to decide a cache hit.

An entry is keyed by the artifact's location (the run's artifact URI joined with the path, or a registered version's
source): MLflow never changes what was logged there, so an entry never goes stale. Aliases and `latest` are resolved
to a version first. A download lands in a temporary dir inside the cache and is renamed into place only once complete
and checked (against the manifest digest recorded when it was logged, or a checkpoint's COMPLETE marker): an entry
that exists is whole. A lock per entry makes two processes on this machine download it once; a temporary dir left
by a process killed mid-download is removed by the next download of that entry. A stage's own outputs are moved
into the cache when it publishes them (`adopt`), so nothing it uploads is downloaded back. A local store's artifacts
are the stored files themselves: no copy, no entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from urllib.parse import urlparse

import mlflow
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

from stages.home import file_lock, state_dir
from stages.manifest import manifest_digest, read_manifest, verify_digest
from stages.net import ArtifactNotFound
from stages.resolving import resolver
from stages.tracking import RetryingClient, model_version, store_call

Check = Callable[[Path], bool]
_log = logging.getLogger(__name__)


def root() -> Path:
    return state_dir() / "artifact-cache"


def staging() -> Path:
    """Where downloads (and a stage's outputs before `adopt`) are written: inside the cache, so that moving them
    into place is a rename."""
    path = root() / ".staging"
    path.mkdir(parents=True, exist_ok=True)
    return path


def staging_prefix(stage: str) -> str:
    """The name prefix of a stage's output dir in `staging()`: `rlhf-<stage>-<pid>-`, so `clean_staging` can tell a
    killed process's leftovers from a live one's."""
    return f"rlhf-{stage}-{os.getpid()}-"


def clean_staging() -> list[Path]:
    """Remove the stage output dirs in `staging()` whose process is gone (a killed run's half-written outputs);
    returns them."""
    import psutil

    removed = []
    for entry in staging().glob("rlhf-*-*-*"):
        parts = entry.name.split("-")
        if len(parts) >= 4 and parts[2].isdigit() and not psutil.pid_exists(int(parts[2])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def is_local(location: str) -> bool:
    return urlparse(location).scheme in ("", "file")


def resolve(uri: str) -> str:
    """The immutable location of `uri`: a registered version's source (aliases and `latest` resolved), a run's
    artifact URI joined with the path, else `uri` itself."""
    try:
        if uri.startswith("models:/") and not uri.startswith("models:/m-"):
            return resolve(model_version(uri).source)
        if uri.startswith("runs:/"):
            run_id, _, path = uri.removeprefix("runs:/").partition("/")
            return posixpath.join(RetryingClient().get_run(run_id).info.artifact_uri, path).rstrip("/")
    except mlflow.exceptions.MlflowException as e:
        raise ArtifactNotFound(f"cannot load artifact {uri}: {e.message}") from None
    return uri


@resolver
def download(uri: str, digest: str | None = None, check: Check | None = None) -> Path:
    """The local path of an artifact or `models:/` URI, downloaded at most once per machine. `digest` (the manifest
    digest recorded at log time) or `check` must accept a download before it is kept. Callers only read the path."""
    location = resolve(uri)
    try:
        if is_local(location):  # the stored files themselves
            return Path(store_call(f"download {uri}", mlflow.artifacts.download_artifacts, artifact_uri=location))
        if check is None and digest is not None:
            check = partial(verify_digest, digest=digest)
        return fetch(location, check)
    except mlflow.exceptions.MlflowException as e:
        raise ArtifactNotFound(f"cannot load artifact {uri}: {e.message}") from None


def download_own(uri: str, check: Check | None = None) -> Path:
    """`download` for a build's own artifacts, which only the build can find: a checkpoint of the interrupted run
    it resumes (`stages.resume`). Inputs are never fetched this way: they come resolved (`stages.inputs`)."""
    return download.__wrapped__(uri, check=check)


def transfer(location: str, dst: Path) -> Path:
    """The one place artifact bytes move onto this machine (tests count its calls)."""
    dst.mkdir(parents=True, exist_ok=True)
    return Path(store_call(f"download {location}", mlflow.artifacts.download_artifacts, artifact_uri=location,
                           dst_path=str(dst)))


def _entry(location: str) -> Path:
    """`<cache>/<sha256 of location>/<artifact name>`: the name kept, so a file's entry is a dir holding it."""
    key = hashlib.sha256(location.encode()).hexdigest()[:32]
    return root() / key / (posixpath.basename(urlparse(location).path.rstrip("/")) or "artifact")


def cached(location: str) -> Path | None:
    path = _entry(location)
    return path if path.exists() else None


def fetch(location: str, check: Check | None = None) -> Path:
    """The cache entry of a remote `location`, downloaded first if absent (see the module docstring)."""
    if (hit := cached(location)) is not None:
        return hit
    entry = _entry(location)
    key = entry.parent.name
    with file_lock(f"artifact-{key}"):
        if (hit := cached(location)) is not None:  # downloaded by another process while this one waited
            return hit
        for stale in staging().glob(f"{key}-*"):  # we hold the lock: no live download writes these
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=staging()))
        try:
            got = transfer(location, tmp / "download")
            if check is not None and not check(got):
                raise ArtifactNotFound(f"{location}: the downloaded files do not match what was logged (corrupted "
                                       "or partly deleted in the store)")
            (tmp / "entry").mkdir()
            got.rename(tmp / "entry" / entry.name)
            (tmp / "entry").rename(entry.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def adopt(local_dir: Path, location: str) -> None:
    """Move `local_dir`, just logged to `location`, into the cache: the stage's own outputs are never downloaded
    back. Best effort: a failure only costs a later download."""
    if is_local(location):
        return
    entry = _entry(location)
    try:
        with file_lock(f"artifact-{entry.parent.name}"):
            if cached(location) is None:
                box = Path(tempfile.mkdtemp(prefix=f"{entry.parent.name}-", dir=staging()))
                shutil.move(local_dir, box / entry.name)
                box.rename(entry.parent)
    except OSError as e:
        _log.warning("could not keep %s in the artifact cache (%s): it will be downloaded when needed", location, e)


def evict(location: str) -> None:
    """Drop an entry that will not be read again (a retired run's checkpoint)."""
    if is_local(location):
        return
    entry = _entry(location).parent
    with file_lock(f"artifact-{entry.name}"):
        if entry.exists():
            trash = Path(tempfile.mkdtemp(prefix=f"{entry.name}-", dir=staging()))
            entry.rename(trash / "old")
            shutil.rmtree(trash, ignore_errors=True)


def stored_manifest(location: str) -> dict[str, str] | None:
    """The `manifest.json` of an artifact dir: from the stored or cached files, else downloaded alone (small)."""
    try:
        local = download(location) if is_local(location) else cached(location)
        if local is not None:
            return read_manifest(local)
        return json.loads(fetch(f"{location}/manifest.json").read_text())
    except (ArtifactNotFound, mlflow.exceptions.MlflowException, ValueError):
        return None


def listed_files(location: str) -> set[str]:
    """The relative paths of every file stored under `location` (a listing: no bytes move)."""
    repo = get_artifact_repository(location)
    files: set[str] = set()
    todo: list[str | None] = [None]  # None: the artifact's own root
    while todo:
        path = todo.pop()
        try:
            infos = store_call("list_artifacts", repo.list_artifacts, path)
        except mlflow.exceptions.MlflowException:  # a missing dir
            return files
        todo += [info.path for info in infos if info.is_dir]
        files |= {info.path for info in infos if not info.is_dir}
    return files


def intact(location: str, digest: str) -> bool:
    """Whether the artifact dir at `location` is all there, judged from its manifest and a listing, never from its
    bytes: the manifest matches `digest` and every file it names is stored. Bytes are checked where they are
    downloaded (`download`)."""
    stored = listed_files(location)
    if "manifest.json" not in stored:  # listed first: a missing file is not waited for by the retry policy
        return False
    files = stored_manifest(location)
    return files is not None and manifest_digest(files) == digest and set(files) <= stored
