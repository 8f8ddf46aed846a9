"""Start real servers (nginx, the Debian ``docker-registry``) on free loopback ports, each
with its own config in a directory of ours, and stop them by PID.

Used by the pytest fixtures and by every benchmark. ``netns`` runs the server inside a
network namespace (see :mod:`bootseer.testing.netns`), where it listens on that
namespace's loopback, or on ``host`` (that namespace's address on a bridge).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootseer.errors import BootseerError
from bootseer.node import proc as procs


class ServerError(BootseerError, RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ns_prefix(netns: str | None) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{netns}"] if netns else []


def wait_port(port: int, *, netns: str | None = None, timeout: float = 15.0,
              proc: subprocess.Popen[bytes] | None = None, what: str = "server",
              host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"{what} exited with status {proc.returncode} before listening")
        if netns:
            r = subprocess.run(_ns_prefix(netns) + ["bash", "-c", f"echo > /dev/tcp/{host}/{port}"],
                               capture_output=True)
            if r.returncode == 0:
                return
        else:
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    return
            except OSError:
                pass
        time.sleep(0.05)
    raise ServerError(f"{what} did not listen on {host}:{port} within {timeout:.0f}s")


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path
    log: Path
    netns: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def kill(self) -> None:
        """Kill hard, as a crash would (used by fault tests)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def nginx_available() -> bool:
    return shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()


def registry_available() -> bool:
    return shutil.which("docker-registry") is not None


def start_nginx(root: str | os.PathLike[str], workdir: str | os.PathLike[str], *,
                port: int | None = None,
                limit_rate: str | None = None, autoindex: bool = True,
                netns: str | None = None, workers: int = 2,
                extra_locations: str = "", tls: tuple[str, str] | None = None,
                access_log: bool = False, worker_user: str | None = None,
                host: str = "127.0.0.1") -> Server:
    """Serve ``root`` read-only over HTTP/1.1 with range support and a JSON listing.

    ``worker_user``: run the workers as this user (as root, default: root), as a packaged
    nginx does (``www-data``), to see what an ordinary server can read.

    ``limit_rate`` (e.g. ``"15m"`` bytes/s) caps each connection: one storage node's stream.
    ``extra_locations`` is nginx config put inside the ``server`` block, e.g.
    ``"location /err500/ { return 500; }"`` (fault tests). ``tls`` = (certificate file,
    key file) serves HTTPS instead (the URL is then ``https://127.0.0.1:<port>``).
    """
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    rate = f"limit_rate {limit_rate};" if limit_rate else ""
    index = "autoindex on; autoindex_format json;" if autoindex else ""
    conf = workdir / "nginx.conf"
    # Workers read files of ours (often in 0700 temp dirs): run them as ourselves.
    user = f"user {worker_user};" if worker_user else "user root;" if os.geteuid() == 0 else ""
    conf.write_text(f"""
{user}
daemon off;
master_process on;
worker_processes {workers};
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {f"{workdir}/access.log" if access_log else "off"};
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    keepalive_timeout 120s;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    types {{ application/octet-stream bin; application/json json; text/html html; }}
    default_type application/octet-stream;
    server {{
        listen {host}:{port}{" ssl" if tls else ""};
        {f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};" if tls else ""}
        root {Path(root).resolve()};
        {rate}
        location / {{ {index} }}
        {extra_locations}
    }}
}}
""")
    log = workdir / "nginx.out"
    with open(log, "ab") as out:
        proc = procs.spawn(   # never outlives its starter (proc.py), whatever thread starts it
            subprocess.Popen, _ns_prefix(netns) + [nginx, "-c", str(conf), "-p", str(workdir)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=procs.preexec())
    server = Server("nginx", port, proc, workdir, log, netns, host=host)
    try:
        wait_port(port, netns=netns, proc=proc, what="nginx", host=host)
    except ServerError as e:
        server.stop()
        raise ServerError(f"{e}; log: {log.read_text()[-2000:]}") from None
    return server


def start_registry(storage: str | os.PathLike[str], workdir: str | os.PathLike[str], *,
                   port: int | None = None, netns: str | None = None,
                   htpasswd: str | None = None, host: str = "127.0.0.1") -> Server:
    """Run the Debian ``docker-registry`` (distribution 2.8) with filesystem storage.

    ``htpasswd`` is the path of a bcrypt htpasswd file to require basic auth.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    auth = (f"auth:\n  htpasswd:\n    realm: bootseer-test\n    path: {htpasswd}\n"
            if htpasswd else "")
    conf = workdir / "registry.yml"
    conf.write_text(f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {Path(storage).resolve()}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: {host}:{port}
{auth}""")
    log = workdir / "registry.out"
    with open(log, "ab") as out:
        proc = procs.spawn(
            subprocess.Popen, _ns_prefix(netns) + ["docker-registry", "serve", str(conf)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=procs.preexec(), env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
    server = Server("registry", port, proc, workdir, log, netns, host=host)
    try:
        wait_port(port, netns=netns, proc=proc, what="docker-registry", host=host)
    except ServerError as e:
        server.stop()
        raise ServerError(f"{e}; log: {log.read_text()[-2000:]}") from None
    return server
