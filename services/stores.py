"""The shared stores of `rlhf up --stores postgres`: the production layout of docs/operations.md ("Shared stores") on
one machine. MLflow's and Prefect's databases are on PostgreSQL, MLflow's artifacts on an S3-compatible server.

- PostgreSQL: a cluster under `<state>/services/postgres/`, made by `initdb` on first use and kept, run in the
  foreground as one more background service (pid and log files as for the others) on 127.0.0.1:$RLHF_POSTGRES_PORT
  (5433, beside a system server's 5432), and stopped by `pg_ctl stop -m fast`. Databases `mlflow` and `prefect`, role
  `rlhf` with a generated password (`<state>/services/postgres.password`). PostgreSQL refuses to run as root: as
  root, the cluster belongs to and runs as the system user `postgres`.
- S3: moto in server mode on 127.0.0.1:$RLHF_S3_PORT (9000), bucket `rlhf-artifacts`, checking a key generated at
  its start (`services.s3_auth`). moto keeps objects in memory, so `rlhf down` drops the artifacts;
  `RLHF_S3_ENDPOINT_URL` names a lasting S3-compatible server to use instead, with the AWS credentials of the
  environment.
- The MLflow server proxies the artifacts (`--artifacts-destination s3://rlhf-artifacts`): only it holds S3
  credentials, and clients need nothing but the tracking URI.

The stores listen on loopback only, whatever `RLHF_HOST` says: only the MLflow and Prefect servers talk to them.
Nothing here prints; `services.servers` starts and stops what `services()` describes.

Over 300 lines because PostgreSQL and the S3 server start, probe and stop as a pair (MLflow needs both);
the pair is one unit of `rlhf up --stores postgres`.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from services import s3_auth
from services.procs import Service, read_pid, recorded_url, services_dir
from stages.net import ServiceUnreachable, healthy, http_get

STORES = ("local", "postgres")  # the choices of `rlhf up --stores`
NAMES = ("postgres", "s3")  # their services, started before the Prefect and MLflow servers
HOST = "127.0.0.1"
DEFAULT_POSTGRES_PORT = 5433
DEFAULT_S3_PORT = 9000
BUCKET = "rlhf-artifacts"
ROLE = "rlhf"
DATABASES = ("mlflow", "prefect")
RUN_AS_ROOT = "postgres"  # the system user of Debian's postgresql package
PROBE_S = 5.0  # an endpoint that does not answer within this is named as dead
AWS_PROFILE_VARS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
MODULES = {"psycopg2": "psycopg2-binary", "asyncpg": "asyncpg", "boto3": "boto3", "moto": "moto[s3]"}


def pg_dir(state: Path) -> Path:
    """The cluster's data directory, `<state>/services/postgres/`."""
    return services_dir(state) / "postgres"


def _pg_binary(name: str) -> str:
    """`initdb`, `postgres` or `pg_ctl`: from PATH, else the newest of Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for bindir in versions:
        if (bindir / name).is_file():
            return str(bindir / name)
    raise RuntimeError(f"PostgreSQL's `{name}` was not found on PATH or in /usr/lib/postgresql/*/bin: install "
                       "the server (Debian: apt-get install postgresql), or use `rlhf up` without --stores postgres.")


def _as_cluster_owner() -> list[str]:
    """The argv prefix that runs a PostgreSQL binary as the cluster's owner: nothing unless this process is root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(RUN_AS_ROOT)
    except KeyError:
        raise RuntimeError(f"PostgreSQL refuses to run as root, and there is no user {RUN_AS_ROOT!r} to run it as: "
                           f"create one (useradd --system {RUN_AS_ROOT}) or run `rlhf up` as another user.") from None
    return ["setpriv", f"--reuid={RUN_AS_ROOT}", f"--regid={RUN_AS_ROOT}", "--init-groups", "--"]


@dataclass(frozen=True)
class SharedStores:
    """Where the stores of one state dir live, and what the MLflow and Prefect servers need to use them."""

    state: Path
    pg_port: int
    s3_endpoint: str
    external_s3: bool  # RLHF_S3_ENDPOINT_URL: a server of the user's, not started or stopped here

    @classmethod
    def from_env(cls, state: Path, env_port: Callable[[str, int], int]) -> SharedStores:
        """Ports from RLHF_POSTGRES_PORT and RLHF_S3_PORT (read by `env_port`), or RLHF_S3_ENDPOINT_URL."""
        external = os.environ.get("RLHF_S3_ENDPOINT_URL", "").rstrip("/")
        endpoint = external or f"http://{HOST}:{env_port('RLHF_S3_PORT', DEFAULT_S3_PORT)}"
        return cls(Path(state).resolve(), env_port("RLHF_POSTGRES_PORT", DEFAULT_POSTGRES_PORT), endpoint,
                   bool(external))

    # -- addresses ---------------------------------------------------------------------------------------------

    @property
    def pg_url(self) -> str:
        """The cluster's address, without credentials (for messages and `rlhf status`)."""
        return f"postgresql://{HOST}:{self.pg_port}"

    def db_url(self, database: str, driver: str) -> str:
        """A SQLAlchemy URL with the role's password: handed to the servers in their environment, never on a
        command line (which every local user can read)."""
        return f"postgresql+{driver}://{ROLE}:{password(self.state)}@{HOST}:{self.pg_port}/{database}"

    def describe(self) -> dict[str, str]:
        """{"postgres", "artifacts"}: what `rlhf up` reports."""
        return {"postgres": f"{self.pg_url} (databases {', '.join(DATABASES)}, role {ROLE})",
                "artifacts": f"s3://{BUCKET} at {self.s3_endpoint}"
                             + ("" if self.external_s3 else " (in memory: `rlhf down` drops them)")}

    # -- before anything starts --------------------------------------------------------------------------------

    def check(self) -> None:
        """Fail before anything starts, naming what is missing: a Python package of the `stores` extra, the
        PostgreSQL binaries, or an answer from RLHF_S3_ENDPOINT_URL (within `PROBE_S`)."""
        missing = [pkg for mod, pkg in MODULES.items() if importlib.util.find_spec(mod) is None]
        if missing:
            raise RuntimeError(f"--stores postgres needs {', '.join(missing)}: pip install -e '.[stores]'")
        if self.external_s3 and http_get(self.s3_endpoint, PROBE_S) is None:
            raise ServiceUnreachable(f"the S3 endpoint {self.s3_endpoint} (RLHF_S3_ENDPOINT_URL) does not answer "
                                     f"within {PROBE_S:.0f} s: start it, or unset RLHF_S3_ENDPOINT_URL to use the "
                                     "bundled one.")
        for name in ("initdb", "postgres", "pg_ctl"):
            _pg_binary(name)
        _as_cluster_owner()

    def prepare(self) -> None:
        """Create the cluster on first use (`initdb`); a cluster that exists is kept as it is."""
        data = pg_dir(self.state)
        if (data / "PG_VERSION").is_file():
            return
        prefix = _as_cluster_owner()
        data.mkdir(parents=True, exist_ok=True)
        pwfile = services_dir(self.state) / "postgres.initdb-password"
        pwfile.touch(mode=0o600)
        pwfile.write_text(password(self.state) + "\n")
        if prefix:  # the cluster belongs to the user it runs as
            owner = pwd.getpwnam(RUN_AS_ROOT)
            for path in (data, pwfile):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        data.chmod(0o700)
        try:
            out = subprocess.run([*prefix, _pg_binary("initdb"), "-D", str(data), "-U", ROLE, f"--pwfile={pwfile}",
                                  "-A", "scram-sha-256", "-E", "UTF8", "--locale=C", "--no-instructions"],
                                 capture_output=True, text=True, timeout=120, check=False)
        finally:
            pwfile.unlink(missing_ok=True)
        if out.returncode != 0:
            reach = (f" (it runs as user {RUN_AS_ROOT}, who must be able to reach {data}: make its parent "
                     "directories searchable, or use another RLHF_HOME)") if prefix else ""
            shutil.rmtree(data, ignore_errors=True)  # a half-made cluster would be taken as made next time
            raise RuntimeError(f"initdb failed for {data}{reach}:\n{(out.stderr or out.stdout).strip()[-2000:]}")

    # -- the services --------------------------------------------------------------------------------------------

    def services(self) -> dict[str, Service]:
        """The store services to start before the Prefect and MLflow servers: PostgreSQL, and S3 unless external."""
        data = pg_dir(self.state)
        # -k '': no Unix socket (its default directory is the system server's); clients come over TCP.
        argv = [*_as_cluster_owner(), _pg_binary("postgres"), "-D", str(data), "-h", HOST, "-p", str(self.pg_port),
                "-k", ""]
        out = {"postgres": Service(name="postgres", argv=argv, env={}, cwd=data, url=self.pg_url, port=self.pg_port,
                                   ready=lambda _s: pg_ready(self.state, self.pg_port))}
        if not self.external_s3:
            port = int(self.s3_endpoint.rsplit(":", 1)[1])
            # Signed requests only, past the three that `s3_auth.bootstrap` spends on the key; the probe's path is
            # not one of them.
            out["s3"] = Service(name="s3", argv=[sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                                env={"INITIAL_NO_AUTH_ACTION_COUNT": str(s3_auth.FREE_ACTIONS)}, cwd=self.state,
                                url=self.s3_endpoint, port=port,
                                ready=lambda _s: http_get(f"{self.s3_endpoint}/moto-api/data.json",
                                                          PROBE_S) is not None)
        return out

    def provision(self, s3_started: bool = False) -> None:
        """Once the stores answer: the databases and the bucket, each created when missing; when this call started
        the bundled S3 server, first its access key (`s3_auth.bootstrap`)."""
        import psycopg2

        conn = psycopg2.connect(host=HOST, port=self.pg_port, user=ROLE, password=password(self.state),
                                dbname="postgres", connect_timeout=int(PROBE_S))
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
            with conn.cursor() as cur:
                for db in DATABASES:
                    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
                    if cur.fetchone() is None:
                        cur.execute(f'CREATE DATABASE "{db}" OWNER "{ROLE}"')
        finally:
            conn.close()
        if s3_started and not self.external_s3:
            s3_auth.bootstrap(self.state, self.s3_endpoint)
        self._ensure_bucket()

    def _ensure_bucket(self) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        local = s3_auth.credentials(self.state)
        if not self.external_s3 and not local:
            raise RuntimeError(f"no key for the S3 store at {self.s3_endpoint} in {s3_auth.credentials_path(self.state)}"
                               ": run `rlhf down`, then `rlhf up --stores postgres` (a new start makes one)")
        creds = {} if self.external_s3 else {"aws_access_key_id": local["AWS_ACCESS_KEY_ID"],
                                             "aws_secret_access_key": local["AWS_SECRET_ACCESS_KEY"],
                                             "region_name": local["AWS_DEFAULT_REGION"]}
        s3 = boto3.client("s3", endpoint_url=self.s3_endpoint, **creds, config=Config(
            connect_timeout=PROBE_S, read_timeout=30, retries={"max_attempts": 2}))
        try:
            try:
                s3.head_bucket(Bucket=BUCKET)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
                    raise
                s3.create_bucket(Bucket=BUCKET)
        except (BotoCoreError, ClientError) as e:
            raise RuntimeError(f"cannot use bucket {BUCKET} at the S3 endpoint {self.s3_endpoint}: {e}") from None

    def adapt(self, specs: dict[str, Service]) -> dict[str, Service]:
        """The Prefect, MLflow and deployment servers of `services.servers`, moved onto the stores."""
        out = dict(specs)
        if "mlflow" in specs:
            svc = specs["mlflow"]
            s3_env = {"MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint,
                      **({} if self.external_s3 else s3_auth.credentials(self.state))}
            out["mlflow"] = replace(
                svc,
                argv=[*_without(svc.argv, "--backend-store-uri", "--default-artifact-root"),
                      "--artifacts-destination", f"s3://{BUCKET}"],
                env={**svc.env, "MLFLOW_BACKEND_STORE_URI": self.db_url("mlflow", "psycopg2"), **s3_env},
                unset=(*svc.unset, *(() if self.external_s3 else AWS_PROFILE_VARS)))
        if "prefect" in specs:
            svc = specs["prefect"]
            out["prefect"] = replace(
                svc, env={**svc.env, "PREFECT_API_DATABASE_CONNECTION_URL": self.db_url("prefect", "asyncpg")},
                ready=lambda _s, ui=svc.url: healthy(f"{ui}/api/ready"))  # 200 once its database answers
        if "serve" in specs and "mlflow" in specs:  # deployment runs log to the shared MLflow, not a local file
            out["serve"] = replace(specs["serve"], env={**specs["serve"].env,
                                                        "MLFLOW_TRACKING_URI": specs["mlflow"].url})
        return out


def password(state: Path) -> str:
    """The role's password, generated on first use and kept beside the cluster (readable by this user only)."""
    path = services_dir(state) / "postgres.password"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()


def pg_ready(state: Path, port: int, timeout_s: float = 2.0) -> bool:
    """Whether the cluster of `state` accepts the role's login on `port`."""
    import psycopg2

    try:
        psycopg2.connect(host=HOST, port=port, user=ROLE, password=password(state), dbname="postgres",
                         connect_timeout=max(1, int(timeout_s))).close()
        return True
    except psycopg2.OperationalError:
        return False


def _without(argv: list[str], *options: str) -> list[str]:
    """`argv` without each of `options` and the value after it."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        else:
            out.append(arg)
    return out


def stop_postgres(state: Path, timeout_s: float) -> None:
    """`pg_ctl stop -m fast`: end the sessions, checkpoint, exit (SIGTERM alone would wait for every client)."""
    subprocess.run([*_as_cluster_owner(), _pg_binary("pg_ctl"), "stop", "-D", str(pg_dir(state)), "-m", "fast",
                    "-w", "-t", str(max(1, int(timeout_s)))], capture_output=True, timeout=timeout_s + 10,
                   check=False)  # not running already: nothing to do


def preflight(mlflow_uri: str | None, prefect_api: str | None, timeout_s: float = PROBE_S) -> None:
    """Fail within seconds, naming the URL, when a server answers but a store behind it does not: the Prefect API's
    database (`/ready`), the MLflow server's database (a read of the experiment) or its artifact store (a listing of
    the proxied artifacts). A run would otherwise take each for a passing server error and wait it out by the retry
    policy (`stages.retry`, about a minute). Only http(s) URLs are probed; a status below 500 passes (a server that
    does not proxy artifacts answers 404 there)."""
    probes: list[tuple[str, str, str]] = []
    if prefect_api and prefect_api.startswith("http"):
        api = prefect_api.rstrip("/")
        probes.append((f"{api}/ready", f"the Prefect API at {api}", "its database"))
    if mlflow_uri and mlflow_uri.startswith("http"):
        uri = mlflow_uri.rstrip("/")
        probes += [(f"{uri}/api/2.0/mlflow/experiments/get-by-name?experiment_name=rlhf",  # a read: 200 or 404
                    f"the MLflow tracking server {uri}", "its backend store (database)"),
                   (f"{uri}/api/2.0/mlflow-artifacts/artifacts?path=", f"the MLflow tracking server {uri}",
                    "its artifact store")]
    for url, server, store in probes:
        got = http_get(url, timeout_s)
        if got is not None and got[0] >= 500:
            raise ServiceUnreachable(f"{server} answers, but not from {store}: HTTP {got[0]} on {url}. Start the "
                                     "store (`rlhf up --stores postgres` restarts its own), then run again.")


def _kind_file(state: Path) -> Path:
    return services_dir(state) / "stores"


def recorded_kind(state: Path) -> str:
    """The `--stores` of the services `up` last started for `state` ("local" when none was recorded)."""
    try:
        return _kind_file(state).read_text().strip() or "local"
    except OSError:
        return "local"


def record_kind(state: Path, kind: str | None) -> None:
    """Record the `--stores` of the services being started; None (at `down`) forgets it."""
    if kind is None:
        _kind_file(state).unlink(missing_ok=True)
        return
    services_dir(state).mkdir(parents=True, exist_ok=True)
    _kind_file(state).write_text(kind + "\n")


def recorded(state: Path) -> dict[str, tuple[str, Callable[[], bool]]]:
    """The store services `up` recorded for `state`, for `rlhf status`: {name: (url, whether it answers)}."""
    out: dict[str, tuple[str, Callable[[], bool]]] = {}
    for name in NAMES:
        url = recorded_url(state, name, "")
        if read_pid(state, name) is None or not url:
            continue
        if name == "postgres":
            out[name] = (url, lambda url=url: pg_ready(state, int(url.rsplit(":", 1)[1])))
        else:
            out[name] = (url, lambda url=url: http_get(url, PROBE_S) is not None)
    return out
