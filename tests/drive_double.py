"""Google Drive as the checkpoint mirror meets it, over a real folder: what cannot exist here is Drive itself.

:class:`BudgetDrive` is a Drive-like place (``<base>/content_drive/MyDrive``) with a byte budget that counts its
bin, as Drive's quota does: a file deleted through the "mount" moves to the bin and keeps its bytes there until it
is deleted for good through the Drive API, which a small HTTP server on loopback answers (``files.get`` and
``files.delete``, the two calls the package makes, through its real client). Where the tests may mount a tmpfs
(root), the place is one of exactly the budget's size, so the kernel enforces the limit too (ENOSPC); elsewhere
the budget is what the place reports as free, and :attr:`BudgetDrive.peak` records the most it ever held.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

from tpu_pretrain.storage import drive
from tpu_pretrain.storage.drive_api import DriveApi


class BudgetDrive(drive.DriveMount):
    margin = 64 * 1024

    def __init__(self, base: Path, budget: int, signed_in: bool = True):
        self.base, self.budget = Path(base), budget
        self.base.mkdir(parents=True, exist_ok=True)
        self.tmpfs = _mount_tmpfs(self.base, budget)
        super().__init__(str(self.base / "content_drive"))
        self.my_drive = Path(self.root) / "MyDrive"
        self.bin = self.base / "bin"  # outside the mount: Drive does not list its bin there either
        self.my_drive.mkdir(parents=True)
        self.bin.mkdir()
        self.peak = 0
        self.deleted_for_good: list[str] = []  # names the API deleted
        self._upload: tuple[Path, int, int] | None = None
        self._ids: dict[tuple[int, int], str] = {}
        self._lock = threading.Lock()
        self.server = _ApiServer(self) if signed_in else None

    # -- what the package asks of a mount ----------------------------------------------------------------
    def used(self) -> int:
        sizes = [p.stat().st_size for folder in (Path(self.root), self.bin) for p in folder.rglob("*") if p.is_file()]
        self.peak = max(self.peak, sum(sizes))
        return sum(sizes)

    def free_space(self, path: str) -> int | None:
        if self._upload is not None:
            self._upload_later()
        free = max(0, self.budget - self.used())
        return min(free, shutil.disk_usage(self.base).free) if self.tmpfs else free

    def upload_later(self, name: str, size: int) -> None:
        """A file the user's other devices put in Drive once the run has started (after its first space check)."""
        self._upload = (self.my_drive / name, size, 1)

    def _upload_later(self) -> None:
        path, size, checks_before = self._upload
        if checks_before:
            self._upload = (path, size, checks_before - 1)
            return
        path.write_bytes(b"\0" * size)
        self._upload = None

    def file_id(self, path: str) -> str | None:
        """Ids that never name another file, as Drive's (a file system may give a deleted file's inode anew)."""
        stat = os.stat(path)
        with self._lock:
            return self._ids.setdefault((stat.st_ino, stat.st_mtime_ns), f"id{len(self._ids)}")

    def trash(self, path: str) -> None:
        os.rename(path, self.bin / f"{os.stat(path).st_ino}-{os.path.basename(path)}")

    def api(self):
        if self.server is None:
            return None
        import requests

        return DriveApi(requests.Session(), self.server.url)

    # -- what a test looks at --------------------------------------------------------------------------------
    def find(self, file_id: str) -> Path | None:
        with self._lock:
            key = next((key for key, value in self._ids.items() if value == file_id), None)
        for folder in (Path(self.root), self.bin):
            for path in folder.rglob("*"):
                if key and path.is_file() and (path.stat().st_ino, path.stat().st_mtime_ns) == key:
                    return path
        return None

    def bin_files(self) -> dict[str, int]:
        return {p.name: p.stat().st_size for p in self.bin.iterdir()}

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.base)], check=False)


@contextlib.contextmanager
def drive_in_use(base: Path, budget: int, signed_in: bool = True):
    """A :class:`BudgetDrive` as the package's Drive for the duration; the previous one afterwards."""
    double = BudgetDrive(base, budget, signed_in)
    previous = drive.use_mount(double)
    try:
        yield double
    finally:
        drive.use_mount(previous)
        double.close()


def _mount_tmpfs(path: Path, size: int) -> bool:
    """Make ``path`` a tmpfs of ``size`` bytes when this process may (root); False otherwise."""
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


class _ApiServer:
    """``GET`` and ``DELETE /files/<id>`` of the Drive API v3 over the double's folder, on loopback."""

    def __init__(self, double: BudgetDrive):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self._file()
                if path is not None:
                    body = json.dumps({"id": self._id(), "name": _original_name(path, double), "size":
                                       str(path.stat().st_size), "trashed": double.bin in path.parents,
                                       "ownedByMe": True}).encode()
                    self._answer(200, body)

            def do_DELETE(self):
                path = self._file()
                if path is not None:
                    double.deleted_for_good.append(_original_name(path, double))
                    path.unlink()
                    self._answer(204, b"")

            def _id(self) -> str:
                return urlparse(self.path).path.rsplit("/", 1)[-1]

            def _file(self) -> Path | None:
                path = double.find(self._id())
                if path is None:
                    self._answer(404, b'{"error": {"message": "File not found"}}')
                return path

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/drive/v3"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _original_name(path: Path, double: BudgetDrive) -> str:
    return path.name.split("-", 1)[1] if double.bin in path.parents else path.name
