"""Credentials of the bundled S3 store (moto) of `rlhf up --stores postgres`.

moto takes any credentials unless told to check them: started with `INITIAL_NO_AUTH_ACTION_COUNT=3`, it answers
exactly three requests without them, which `bootstrap` spends on an IAM user `rlhf`, its S3 policy and its access
key; from then on every S3 request must be signed with that key. The key is kept in `<state>/services/s3.credentials`
(readable by this user only) and handed to the MLflow server, the only client of the store. moto's state is in memory,
so every start of it bootstraps a new key; its readiness probe (`/moto-api/`) is not one of the three.

moto checks only a request's `Authorization` header, so a presigned URL fails against it: the pipeline's MLflow
clients download and upload through the tracking server instead (`MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD/UPLOAD`
default to false, `stages.retry.configure_client`). moto still answers its unauthenticated `/moto-api/` (e.g. a reset
that drops every object): on a machine shared with users you do not trust, use a lasting S3-compatible server
(`RLHF_S3_ENDPOINT_URL`, docs/operations.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from services.procs import services_dir

FREE_ACTIONS = 3  # create_user, put_user_policy, create_access_key
USER = "rlhf"
REGION = "us-east-1"
POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


def credentials_path(state: Path) -> Path:
    return services_dir(state) / "s3.credentials"


def credentials(state: Path) -> dict[str, str]:
    """The environment of a client of the bundled store: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_DEFAULT_REGION; empty before the first `bootstrap`."""
    path = credentials_path(state)
    return json.loads(path.read_text()) if path.is_file() else {}


def bootstrap(state: Path, endpoint: str) -> dict[str, str]:
    """Spend the fresh moto server's unauthenticated requests on a user, its policy and an access key; write the key
    to `credentials_path` (mode 0600) and return it as `credentials` does."""
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="bootstrap",
                       aws_secret_access_key="bootstrap")
    iam.create_user(UserName=USER)
    iam.put_user_policy(UserName=USER, PolicyName="s3", PolicyDocument=json.dumps(POLICY))
    key = iam.create_access_key(UserName=USER)["AccessKey"]
    creds = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
             "AWS_DEFAULT_REGION": REGION}
    path = credentials_path(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps(creds))
    return creds
