"""The local artifact cache: one download per artifact per machine, atomic (a failed or corrupted download leaves
nothing), no temporary dir left behind, and the look-up's intactness check reads a manifest and a listing only."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import pytest

from stages import artifact_cache
from stages.manifest import write_manifest
from stages.net import ArtifactNotFound

REMOTE = "mlflow-artifacts:/1/abc123/artifacts/model"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path


@pytest.fixture()
def store(tmp_path):
    """A model dir as a remote store holds it, with its manifest; its digest."""
    src = tmp_path / "store" / "model"
    src.mkdir(parents=True)
    (src / "weights.bin").write_bytes(b"\x01" * 1000)
    (src / "config.json").write_text("{}")
    return src, write_manifest(src)


class FakeTransfer:
    """Stands in for `artifact_cache.transfer`: copies the store's dir like MLflow's download into `dst`, counting
    calls; `fail_after` files, it raises instead (a dropped connection)."""

    def __init__(self, src: Path, fail_after: int | None = None, delay: float = 0.0):
        self.src, self.fail_after, self.delay, self.calls = src, fail_after, delay, 0

    def __call__(self, location: str, dst: Path) -> Path:
        self.calls += 1
        time.sleep(self.delay)
        out = dst / self.src.name
        out.mkdir(parents=True)
        for i, f in enumerate(sorted(self.src.iterdir())):
            if self.fail_after is not None and i >= self.fail_after:
                raise ConnectionError("connection reset")
            (out / f.name).write_bytes(f.read_bytes())
        return out


def leftovers(home: Path) -> list[str]:
    """Temporary dirs left in the cache's staging dir or the system temp dir."""
    staging = artifact_cache.root() / ".staging"
    return [p.name for p in [*staging.glob("*"), *(home / "tmp").glob("*")]]


def test_a_second_download_reads_the_cache_and_no_temp_dir_is_left(store, monkeypatch, home):
    src, digest = store
    fake = FakeTransfer(src)
    monkeypatch.setattr(artifact_cache, "transfer", fake)
    first = artifact_cache.download(REMOTE, digest)
    again = artifact_cache.download(REMOTE, digest)
    assert fake.calls == 1 and first == again and first.name == "model"
    assert (first / "weights.bin").read_bytes() == b"\x01" * 1000
    assert leftovers(home) == []


def test_a_failed_download_leaves_nothing_and_the_next_one_starts_afresh(store, monkeypatch, home):
    src, digest = store
    monkeypatch.setattr(artifact_cache, "transfer", FakeTransfer(src, fail_after=1))
    with pytest.raises(ConnectionError):
        artifact_cache.download(REMOTE, digest)
    assert artifact_cache.cached(REMOTE) is None and leftovers(home) == []
    fake = FakeTransfer(src)
    monkeypatch.setattr(artifact_cache, "transfer", fake)
    assert (artifact_cache.download(REMOTE, digest) / "weights.bin").is_file() and fake.calls == 1


def test_a_download_that_does_not_match_its_digest_is_not_kept(store, monkeypatch, home):
    src, digest = store
    (src / "weights.bin").write_bytes(b"\x02" * 1000)  # corrupted in the store after it was logged
    monkeypatch.setattr(artifact_cache, "transfer", FakeTransfer(src))
    with pytest.raises(ArtifactNotFound, match="do not match"):
        artifact_cache.download(REMOTE, digest)
    assert artifact_cache.cached(REMOTE) is None and leftovers(home) == []


def test_a_half_download_of_a_killed_process_is_removed_not_used(store, monkeypatch, home):
    src, digest = store
    key = artifact_cache._entry(REMOTE).parent.name
    stale = artifact_cache.staging() / f"{key}-killed" / "download" / "model"
    stale.mkdir(parents=True)
    (stale / "weights.bin").write_bytes(b"half")
    fake = FakeTransfer(src)
    monkeypatch.setattr(artifact_cache, "transfer", fake)
    assert (artifact_cache.download(REMOTE, digest) / "weights.bin").read_bytes() == b"\x01" * 1000
    assert fake.calls == 1 and leftovers(home) == []


def test_two_processes_wanting_one_artifact_download_it_once(store, monkeypatch):
    src, digest = store
    fake = FakeTransfer(src, delay=0.3)
    monkeypatch.setattr(artifact_cache, "transfer", fake)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(artifact_cache.download(REMOTE, digest))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == 1 and got[0] == got[1]


def test_a_stage_output_adopted_after_publishing_is_never_downloaded(store, monkeypatch, home):
    src, _ = store
    fake = FakeTransfer(src)
    monkeypatch.setattr(artifact_cache, "transfer", fake)
    out = artifact_cache.staging() / "rlhf-sft-x" / "model"
    out.mkdir(parents=True)
    (out / "weights.bin").write_bytes(b"\x01" * 1000)
    artifact_cache.adopt(out, REMOTE)
    assert not out.exists()
    assert (artifact_cache.download(REMOTE) / "weights.bin").is_file() and fake.calls == 0


def test_a_local_store_is_read_in_place(store, monkeypatch):
    src, digest = store
    monkeypatch.setattr(artifact_cache, "transfer", FakeTransfer(src))
    assert artifact_cache.download(src.as_uri(), digest) == src
    artifact_cache.adopt(src, src.as_uri())
    assert src.is_dir() and not artifact_cache.root().exists()


def test_the_real_mlflow_download_lands_in_the_layout_the_cache_expects(store):
    """`fetch` through MLflow's own `download_artifacts` (a file:// location stands in for any store): a dir and a
    single file each become one entry, in a dir of their own."""
    src, _ = store
    model = artifact_cache.fetch(src.as_uri())
    assert model.name == "model" and {p.name for p in model.iterdir()} == {"weights.bin", "config.json",
                                                                           "manifest.json"}
    manifest = artifact_cache.fetch(f"{src.as_uri()}/manifest.json")
    assert manifest.is_file() and [p.name for p in manifest.parent.iterdir()] == ["manifest.json"]


def test_intact_reads_the_manifest_and_a_listing_not_the_files(store, monkeypatch):
    src, digest = store
    uri = src.as_uri()
    from stages import manifest

    monkeypatch.setattr(manifest, "file_sha256", lambda *a: pytest.fail("hashed the files"))
    assert artifact_cache.intact(uri, digest)
    assert not artifact_cache.intact(uri, "0" * 64)  # another artifact's digest
    (src / "weights.bin").unlink()
    assert not artifact_cache.intact(uri, digest)  # a deleted file is a miss
    (src / "manifest.json").unlink()
    assert not artifact_cache.intact(uri, digest)


def test_evict_drops_an_entry(store, monkeypatch):
    src, digest = store
    fake = FakeTransfer(src)
    monkeypatch.setattr(artifact_cache, "transfer", fake)
    artifact_cache.download(REMOTE, digest)
    artifact_cache.evict(REMOTE)
    assert artifact_cache.cached(REMOTE) is None
    artifact_cache.download(REMOTE, digest)
    assert fake.calls == 2
