"""`rlhf serve-reward`: the app's protocol (auth, limits, errors) with a stand-in scorer, and the real server on a
registered RM in a throwaway MLflow store, whose scores equal the in-process ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from rlhf_lib.rewards import RewardError, TextBatch
from services.serve_reward import ServeError, make_app, serve

ROOT = Path(__file__).parent.parent.parent
TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY = {"prompts": ["p1", "p2"], "completions": ["a", "bcd"], "finished": [True, False], "columns": {"k": [1, 2]}}


def length_scorer(batch: TextBatch) -> list[float]:
    if "boom" in batch.completions:
        raise RewardError("reward model x: row 0: no token to score")
    return [float(len(c)) for c in batch.completions]


@pytest.fixture()
def client():
    return TestClient(make_app(length_scorer, TOKEN, max_batch=3, model_name="models:/rlhf-reward/1",
                               info={"digest": "abc"}))


def test_health_needs_no_token(client):
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "model": "models:/rlhf-reward/1", "digest": "abc"}


def test_scores(client):
    r = client.post("/score", json=BODY, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"scores": [1.0, 3.0]}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                                     {"Authorization": TOKEN}])
def test_token_required(client, headers):
    r = client.post("/score", json=BODY, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"detail": "missing or wrong bearer token (send Authorization: Bearer <token>)"}


def test_too_many_rows(client):
    body = {"prompts": ["p"] * 4, "completions": ["c"] * 4, "finished": [True] * 4}
    r = client.post("/score", json=body, headers=AUTH)
    assert r.status_code == 413 and r.json()["detail"].startswith("4 rows in one request; this server takes at most 3 "
                                                                  "(--max-batch)")


@pytest.mark.parametrize(("body", "status", "detail"), [
    (b"{not json", 400, "the request body is not JSON: "),
    (b'{"prompts": "p", "completions": ["c"]}', 422, "field 'prompts' must be a list of strings"),
    (b'{"prompts": ["p"], "completions": ["c"], "finished": [1]}', 422, "field 'finished' must be a list of booleans"),
    (b'{"prompts": ["p", "q"], "completions": ["c"]}', 422, "TextBatch: 2 prompts but {'completions': 1"),
    (b'{"prompts": ["p"], "completions": ["boom"]}', 422, "reward model x: row 0: no token to score"),
])
def test_bad_requests_are_named(client, body, status, detail):
    r = client.post("/score", content=body, headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == status and r.json()["detail"].startswith(detail)


def test_no_docs_pages(client):
    assert client.get("/docs").status_code == 404 and client.get("/openapi.json").status_code == 404


def test_refuses_to_start_without_the_token_variable(monkeypatch):
    monkeypatch.delenv("RLHF_TEST_NO_SUCH_TOKEN", raising=False)
    with pytest.raises(ServeError) as e:
        serve("models:/rlhf-reward/1", token_env="RLHF_TEST_NO_SUCH_TOKEN")  # refused before any MLflow look-up
    assert "environment variable RLHF_TEST_NO_SUCH_TOKEN is not set" in str(e.value)
    with pytest.raises(ServeError, match="empty token"):
        make_app(length_scorer, "", 3, "m")


def register_tiny_rm(home: Path, tiny_tokenizer) -> tuple[str, Path]:
    """A tiny RM saved as the reward stage saves one and registered as `rlhf-reward` version 1 in the MLflow store
    under `home`; returns its URI and the saved directory."""
    import mlflow
    import torch
    from mlflow import MlflowClient

    from rlhf_lib.model_dirs import save_model
    from rlhf_lib.models import build_policy, build_scalar_model
    from stages.tracking import setup_mlflow

    rm = build_scalar_model(build_policy(tiny_tokenizer, n_layer=1, n_head=2, n_embd=32, n_positions=64), seed=1)
    torch.manual_seed(1)
    torch.nn.init.normal_(rm.score.weight, std=1.0)
    saved = home / "saved-rm"
    save_model(rm, tiny_tokenizer, saved)
    before = mlflow.get_tracking_uri()
    try:
        experiment = setup_mlflow()
        client = MlflowClient()
        run = client.create_run(experiment)
        client.log_artifacts(run.info.run_id, str(saved), "model")
        client.create_registered_model("rlhf-reward")
        client.create_model_version("rlhf-reward", source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
        client.set_terminated(run.info.run_id)
    finally:
        mlflow.set_tracking_uri(before)
    return "models:/rlhf-reward/1", saved


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, limit_s: float = 240.0) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            return httpx.get(url, timeout=2).json()
        except httpx.TransportError:
            time.sleep(0.5)
    raise AssertionError(f"no answer from {url} within {limit_s} s")


def test_served_registered_rm_scores_as_in_process(tmp_path, monkeypatch, tiny_tokenizer):
    from rlhf_lib.model_dirs import load_scalar
    from rlhf_lib.models import load_tokenizer
    from rlhf_lib.rewards.http import HttpReward
    from rlhf_lib.rewards.text_rm import TextRewardModel

    monkeypatch.setenv("RLHF_HOME", str(tmp_path))
    uri, saved = register_tiny_rm(tmp_path, tiny_tokenizer)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {
        "RLHF_HOME": str(tmp_path), "SERVE_TEST_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve-reward", uri, "--port", str(port),
                             "--device", "cpu", "--token-env", "SERVE_TEST_TOKEN", "--max-batch", "8"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        health = wait_healthy(proc, f"http://127.0.0.1:{port}/health")
        assert health["status"] == "ok" and health["model"] == uri and health["source"] == uri
        batch = TextBatch(["\n\nHuman: tell me about topic 3\n\nAssistant:", "\n\nHuman: hi\n\nAssistant:"] * 3,
                          [" Sure, topic 3 is nice.", " Thanks", "", " topic", " nice. Thanks!", " Sure"],
                          [True, False, True, True, False, True])
        monkeypatch.setenv("JUDGE_TOKEN", TOKEN)
        served = HttpReward("judge", f"http://127.0.0.1:{port}/score", token_env="JUDGE_TOKEN", batch_size=4)(batch)
        local = TextRewardModel(load_scalar(saved), load_tokenizer(saved))(batch)
        assert served == pytest.approx(local, abs=1e-5) and len(set(local)) == len(local)
        monkeypatch.setenv("JUDGE_TOKEN", "wrong")
        with pytest.raises(RewardError, match="HTTP 401"):
            HttpReward("judge", f"http://127.0.0.1:{port}/score", token_env="JUDGE_TOKEN")(batch)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    assert TOKEN not in out


def _big_app(**kw):
    return TestClient(make_app(length_scorer, TOKEN, max_batch=3, model_name="m", **kw))


def test_a_body_over_the_cap_is_refused_from_its_content_length():
    client = _big_app(max_body_bytes=1000)
    r = client.post("/score", content=b"x" * 5000, headers=AUTH | {"Content-Type": "application/json"})
    assert r.status_code == 413 and "5,000 bytes" in r.json()["detail"] and "--max-body-mb" in r.json()["detail"]


def test_a_chunked_body_over_the_cap_is_refused_as_it_arrives():
    client = _big_app(max_body_bytes=1000)
    sent = []

    def chunks():
        for _ in range(100):  # 100 kB offered, no Content-Length
            sent.append(1)
            yield b"x" * 1000

    r = client.post("/score", content=chunks(), headers=AUTH)
    assert r.status_code == 413 and "over 1,000 bytes" in r.json()["detail"]


def test_rows_are_counted_before_they_are_parsed_and_deep_nesting_is_400(client):
    body = {"prompts": 7, "completions": ["a"] * 4, "finished": None}  # malformed rows, but too many of them first
    r = client.post("/score", json=body, headers=AUTH)
    assert r.status_code == 413 and "4 rows" in r.json()["detail"]
    deep = b"[" * 100_000 + b"]" * 100_000
    r = client.post("/score", content=deep, headers=AUTH)
    assert r.status_code == 400 and "nests too deep" in r.json()["detail"]


def test_a_long_row_is_cut_in_characters_before_tokenizing(tiny_tokenizer):
    from rlhf_lib.rewards.text_rm import CHARS_PER_TOKEN, TextRewardModel

    class Counting:
        def __init__(self, inner):
            self.inner, self.longest = inner, 0

        def __call__(self, text, **kw):
            self.longest = max(self.longest, len(text))
            return self.inner(text, **kw)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class Config:
        max_position_embeddings = 64

    class Model(torch.nn.Module):
        config = Config()

    tok = Counting(tiny_tokenizer)
    rm = TextRewardModel(Model(), tok, max_length=64)
    rows = rm.encode(TextBatch(["p " * 5_000_000], ["c " * 5_000_000], [True]))  # two 10 MB texts
    assert tok.longest == CHARS_PER_TOKEN * 64 and len(rows[0]) == 64
    short = rm.encode(TextBatch(["a prompt"], [" a reply"], [True]))
    assert short == [tiny_tokenizer("a prompt", add_special_tokens=False)["input_ids"]
                     + tiny_tokenizer(" a reply", add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]]


def _server(app, **kw):
    import threading

    import uvicorn

    from services.serve_reward import timed_protocol

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=timed_protocol(0.5), **kw)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, port


def test_half_sent_requests_are_closed_at_the_header_timeout():
    # Pins uvicorn's H11Protocol attributes that services.serve_reward.timed_protocol reads (conn, loop, transport).
    server, port = _server(make_app(length_scorer, TOKEN, max_batch=3, model_name="m"))
    try:
        socks = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            socks.append(s)
        time.sleep(1.5)
        for s in socks:
            s.settimeout(2)
            assert s.recv(100) == b""  # closed by the server
            s.close()
        r = httpx.post(f"http://127.0.0.1:{port}/score", json=BODY, headers=AUTH, timeout=10)
        assert r.json() == {"scores": [1.0, 3.0]}  # a whole request is still answered
    finally:
        server.should_exit = True


def test_https_with_a_certificate_pair(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    server, port = _server(make_app(length_scorer, TOKEN, max_batch=3, model_name="m"),
                           ssl_certfile=str(tmp_path / "cert.pem"), ssl_keyfile=str(tmp_path / "key.pem"))
    try:
        r = httpx.post(f"https://127.0.0.1:{port}/score", json=BODY, headers=AUTH, timeout=10,
                       verify=str(tmp_path / "cert.pem"))
        assert r.json() == {"scores": [1.0, 3.0]}
    finally:
        server.should_exit = True


def test_tls_options_go_together(monkeypatch):
    monkeypatch.setenv("RLHF_REWARD_TOKEN", "t")
    with pytest.raises(ServeError, match="--tls-cert and --tls-key go together"):
        serve("models:/x/1", tls_cert="c.pem")
