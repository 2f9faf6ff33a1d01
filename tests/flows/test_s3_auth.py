"""The bundled S3 store checks a key made at its start (services/s3_auth.py): the MLflow server's key writes, no key and
a made-up key do not."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

pytest.importorskip("moto")


def test_only_the_bootstrapped_key_reaches_the_bundled_store(tmp_path):
    import boto3
    import botocore
    from botocore.config import Config

    from services import s3_auth
    from stages.net import free_port, http_get

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(s3_auth.FREE_ACTIONS)}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while http_get(f"{endpoint}/moto-api/data.json", 1.0) is None:  # the readiness probe: not a free action
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        creds = s3_auth.bootstrap(tmp_path, endpoint)
        assert s3_auth.credentials(tmp_path) == creds
        assert stat.S_IMODE(s3_auth.credentials_path(tmp_path).stat().st_mode) == 0o600
        good = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"])
        good.create_bucket(Bucket="rlhf-artifacts")
        good.put_object(Bucket="rlhf-artifacts", Key="model/weights", Body=b"trained")
        made_up = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="rlhf-local",
                               aws_secret_access_key="rlhf-local")
        anonymous = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                 config=Config(signature_version=botocore.UNSIGNED))
        for client in (made_up, anonymous):
            with pytest.raises(botocore.exceptions.ClientError):
                client.put_object(Bucket="rlhf-artifacts", Key="model/weights", Body=b"tampered")
        assert good.get_object(Bucket="rlhf-artifacts", Key="model/weights")["Body"].read() == b"trained"
    finally:
        proc.terminate()
        proc.wait(10)
