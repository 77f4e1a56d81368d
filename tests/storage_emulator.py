"""A real Cloud Storage API server for tests: gcp-storage-emulator in a subprocess on loopback.

It runs as a separate process so a test can kill it in the middle of an upload and start it again
on the same port and data folder (the emulator keeps objects and resumable sessions on disk).

The emulator does not enforce permissions (its IAM endpoints only store policies and its
testIamPermissions grants everything), so :class:`DenyingProxy` sits in front of it and answers
chosen requests with the HTTP 403 and JSON error body that Cloud Storage sends: the client library
sees a real HTTP error over a real socket, nothing is mocked. The proxy can also add a fixed
latency per request, which models the network round trip that parallel transfers hide, and cap each
request's throughput, which models the per-stream limit that parallel slices of one file get around.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import requests

# The emulator's HTTPServer keeps the stdlib's listen backlog of 5: under parallel load the kernel
# drops connection attempts and clients stall for a 1 s SYN retransmit, an artefact real Cloud
# Storage does not have. Raise the backlog before starting it; nothing else is changed.
_LAUNCH = (
    "import sys, http.server; http.server.HTTPServer.request_queue_size = 128; "
    "from gcp_storage_emulator.__main__ import main; main(sys.argv[1:])"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Emulator:
    """gcp-storage-emulator on 127.0.0.1:port with its data in ``data_dir``."""

    def __init__(self, data_dir: str | os.PathLike, port: int | None = None):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Emulator:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"emulator-{self.port}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, "-d", str(self.data_dir), "start",
             "--port", str(self.port), "-H", "127.0.0.1", "-q"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"emulator exited with {self.process.returncode}; see {log.name}")
            try:
                requests.get(self.url + "/", timeout=0.5)
                return self
            except requests.RequestException:
                time.sleep(0.05)
        raise RuntimeError("emulator did not start within 20 s")

    def kill(self) -> None:
        """Kill it abruptly (SIGKILL), as a crash or a dropped connection would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> Emulator:
        self.kill()
        return self.start()

    def object_file(self, bucket: str, name: str) -> Path:
        """Where the emulator keeps an object's bytes (tests corrupt it to simulate bit rot)."""
        return self.data_dir / ".cloudstorage" / bucket / name


def forbidden_body(method: str, path: str) -> bytes:
    """The JSON error Cloud Storage returns for a missing permission."""
    permission = "storage.objects.create" if method in ("POST", "PUT") else "storage.objects.get"
    if method == "GET" and path.rstrip("/").endswith("/o"):
        permission = "storage.objects.list"
    if method == "DELETE":
        permission = "storage.objects.delete"
    message = (f"test-sa@example.iam.gserviceaccount.com does not have {permission} access to the "
               "Google Cloud Storage object. Permission '" + permission + "' denied on resource (or it "
               "may not exist).")
    return json.dumps({"error": {"code": 403, "message": message,
                                 "errors": [{"message": message, "domain": "global", "reason": "forbidden"}]}}
                      ).encode()


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # see _LAUNCH


class DenyingProxy:
    """An HTTP proxy to ``upstream`` that answers requests matching ``deny`` with HTTP 403."""

    HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "content-length"}

    def __init__(self, upstream: str, deny: Callable[[str, str], bool] | None = None, latency: float = 0.0,
                 stream_bytes_per_second: float = 0.0):
        self.upstream = urlsplit(upstream)
        self.deny = deny or (lambda method, path: False)
        self.latency = latency
        # A cap on each request's bytes per second, as one stream to a real bucket has (0: none).
        self.stream_bytes_per_second = stream_bytes_per_second
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def setup(self):
                super().setup()  # no Nagle delay: headers and body go out as separate writes
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if proxy.latency:
                    time.sleep(proxy.latency)
                if proxy.stream_bytes_per_second:
                    time.sleep(len(body) / proxy.stream_bytes_per_second)
                if proxy.deny(self.command, self.path):
                    payload = forbidden_body(self.command, self.path.split("?")[0])
                    self.send_response(403)
                    self.send_header("Content-Type", "application/json; charset=UTF-8")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in proxy.HOP}
                headers["Content-Length"] = str(len(body))
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    upstream = conn.getresponse()
                    data = upstream.read()
                except OSError:
                    self.send_response(502)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                finally:
                    conn.close()
                self.send_response(upstream.status)
                for key, value in upstream.getheaders():
                    if key.lower() not in proxy.HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if proxy.stream_bytes_per_second:
                    time.sleep(len(data) / proxy.stream_bytes_per_second)
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> DenyingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def is_write(method: str, path: str) -> bool:
    """Requests that create, change or delete objects (uploads, copies, deletes)."""
    return method in ("POST", "PUT", "PATCH", "DELETE")


def use_emulator(url: str, monkeypatch, tmp_path: Path) -> None:
    """Point tpu_pretrain's Cloud Storage client at an emulator (anonymous credentials, private cache)."""
    from tpu_pretrain.storage import auth

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("TPU_PRETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    auth.reset()
