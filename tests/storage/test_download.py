"""Corpus URLs: a real HTTP server on loopback (Range, ETag, throttled), a download killed part-way and
continued, checksums, the cache, and zip/gzip corpora read as streams."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile

import pytest
from corpora import WIKITEXT, needs_corpora

from tpu_pretrain.config import CorpusConfig
from tpu_pretrain.data.corpus import CorpusReader
from tpu_pretrain.storage.download import DownloadError, cached_path, fetch


class FileServer:
    """Serves files from a dict over HTTP on loopback, honouring Range and If-Range; records each request."""

    def __init__(self, files: dict[str, bytes], chunk: int = 16 << 10, delay: float = 0.0, ranges: bool = True,
                 length: bool = True, etag: bool = True, chunked: bool = False, cut_first: int | None = None,
                 content_type: str | None = None, cut_every: int | None = None):
        """``length``/``etag``: send Content-Length/ETag; ``chunked``: Transfer-Encoding chunked (HTTP/1.1);
        ``cut_first``: the first response closes its connection after this many bytes of the file; ``cut_every``:
        every response does (a connection that keeps dropping)."""
        self.files, self.chunk, self.delay, self.ranges = files, chunk, delay, ranges
        self.length, self.etag, self.chunked, self.cut_first, self.content_type = (length, etag, chunked, cut_first,
                                                                                   content_type)
        self.cut_every = cut_every
        self.requests: list[dict] = []
        self.bytes_sent = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if chunked else "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                server.handle(self)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def handle(self, request) -> None:
        name = request.path.lstrip("/")
        self.requests.append({"path": name, "range": request.headers.get("Range"),
                              "if_range": request.headers.get("If-Range")})
        if name not in self.files:
            request.send_error(404)
            return
        data = self.files[name]
        etag = '"' + hashlib.md5(data).hexdigest() + '"'
        start = 0
        match = re.match(r"bytes=(\d+)-$", request.headers.get("Range") or "")
        if self.ranges and match and request.headers.get("If-Range") in (None, etag):
            start = int(match.group(1))
            if start >= len(data):
                request.send_response(416)
                request.send_header("Content-Range", f"bytes */{len(data)}")
                request.send_header("Content-Length", "0")
                request.end_headers()
                return
            request.send_response(206)
            request.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            request.send_response(200)
        self._send_body(request, data, start, etag)

    def _send_body(self, request, data: bytes, start: int, etag: str) -> None:
        if self.length and not self.chunked:
            request.send_header("Content-Length", str(len(data) - start))
        if self.etag:
            request.send_header("ETag", etag)
        if self.content_type:
            request.send_header("Content-Type", self.content_type)
        if self.chunked:
            request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        end = len(data) if self.cut_every is None else min(len(data), start + self.cut_every)
        if self.cut_first is not None:
            end, self.cut_first = start + self.cut_first, None
        try:
            for offset in range(start, end, self.chunk):
                piece = data[offset:min(offset + self.chunk, end)]
                request.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if self.chunked else piece)
                self.bytes_sent += len(piece)
                time.sleep(self.delay)
            if self.chunked and end == len(data):
                request.wfile.write(b"0\r\n\r\n")
            request.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            pass

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TPU_PRETRAIN_CACHE_DIR", str(folder))
    return folder


@needs_corpora
def test_a_killed_download_continues_with_a_range_request_and_ends_checksummed(tmp_path, cache):
    data = gzip.compress(WIKITEXT.read_bytes(), mtime=0)
    digest = hashlib.sha256(data).hexdigest()
    server = FileServer({"wiki.txt.gz": data}, delay=0.02)  # about 800 KB/s: the kill lands part-way
    url = server.url("wiki.txt.gz")
    part = cached_path(url).with_name("wiki.txt.gz.part")
    env = {**os.environ, "TPU_PRETRAIN_CACHE_DIR": str(cache)}
    code = f"from tpu_pretrain.storage.download import fetch; fetch({url + '#sha256=' + digest!r})"
    try:
        child = subprocess.Popen([sys.executable, "-c", code], env=env)
        deadline = time.time() + 60
        while not (part.exists() and part.stat().st_size > 64 << 10) and time.time() < deadline:
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
        kept = part.stat().st_size
        assert 0 < kept < len(data), "the kill did not land part-way through the download"
        server.delay = 0
        # The restart is the real CLI reading the corpus from the URL (checksum given), building a vocab.
        done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "vocab", "--input", f"{url}#sha256={digest}",
                               "--output_dir", str(tmp_path / "vocab"), "--vocab_size", "600",
                               "--vocab_sample_lines", "2000"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        resumed = server.requests[-1]
        assert resumed["range"] is not None and int(resumed["range"][6:-1]) >= kept
        assert server.bytes_sent < len(data) + kept, "the restart fetched the whole file again"
        final = cached_path(url)
        assert hashlib.sha256(final.read_bytes()).hexdigest() == digest
        assert not part.exists()
        assert (tmp_path / "vocab" / "vocab.txt").is_file()
        requests = len(server.requests)
        assert fetch(f"{url}#sha256={digest}") == final
        assert len(server.requests) == requests, "a complete file was fetched again"
    finally:
        server.close()


def test_a_wrong_checksum_is_an_error_naming_the_url(cache):
    server = FileServer({"c.txt": b"one line\nanother line\n"})
    url = server.url("c.txt")
    try:
        with pytest.raises(DownloadError, match=re.escape(url) + ".*sha256"):
            fetch(url + "#sha256=" + "0" * 64)
        with pytest.raises(DownloadError, match=re.escape(server.url("missing.txt")) + ".*404"):
            fetch(server.url("missing.txt"))
        with pytest.raises(DownloadError, match="#sha256=<hex>"):
            fetch(url + "#latest")
    finally:
        server.close()


def test_a_server_without_ranges_sends_the_file_again_whole(cache):
    data = os.urandom(300_000)
    server = FileServer({"r.bin": data}, ranges=False)
    url = server.url("r.bin")
    part = cached_path(url).with_name("r.bin.part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"stale bytes from another file")
    part.with_name("r.bin.part.json").write_text('{"validator": "\\"old\\"", "size": 300000}')
    try:
        assert fetch(url + "#md5=" + hashlib.md5(data).hexdigest()).read_bytes() == data
    finally:
        server.close()


def test_zip_and_gzip_corpora_are_read_as_streams(tmp_path):
    first, second = "First document line.\nIts second line.\n", "Another document.\n\nAnd a third one.\n"
    archive = tmp_path / "corpus.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as handle:
        handle.writestr("b.txt", second)
        handle.writestr("a.txt", first)
        handle.writestr("folder/", "")
    packed = tmp_path / "plain.gz"
    packed.write_bytes(gzip.compress((first + "\n" + second).encode()))
    docs = list(CorpusReader([str(archive)], CorpusConfig()).documents())
    assert docs == [["First document line.", "Its second line."], ["Another document."], ["And a third one."]]
    assert list(CorpusReader([str(packed)], CorpusConfig()).documents()) == docs


# -- a cut, a length never sent, a page instead of a file (issue 24) -----------------------------------------
@pytest.mark.parametrize("ranges", [True, False], ids=["ranges", "no-ranges"])
def test_a_cut_download_without_a_length_is_never_taken_for_the_whole_file(cache, ranges):
    data = os.urandom(300_000)
    server = FileServer({"c.bin": data}, length=False, etag=False, ranges=ranges, cut_first=144_000)
    try:
        assert fetch(server.url("c.bin")).read_bytes() == data
        if ranges:  # the rest asked for: its Content-Range states the whole size
            assert [r["range"] for r in server.requests] == [None, "bytes=144000-"]
        else:  # a server without ranges: whole again, until two whole responses agree
            assert len(server.requests) == 3
    finally:
        server.close()


def test_a_chunked_response_cut_short_is_continued(cache):
    data = os.urandom(200_000)
    server = FileServer({"c.bin": data}, chunked=True, cut_first=70_000)
    try:
        assert fetch(server.url("c.bin")).read_bytes() == data
        assert [r["range"] for r in server.requests] == [None, "bytes=70000-"]
        assert server.bytes_sent < len(data) + 70_000  # continued, not fetched whole again
    finally:
        server.close()


def test_a_server_without_etag_or_last_modified_still_gets_a_range_request(cache):
    data = os.urandom(300_000)
    server = FileServer({"c.bin": data}, etag=False, cut_first=100_000)
    try:
        assert fetch(server.url("c.bin")).read_bytes() == data
        assert server.requests[1]["range"] == "bytes=100000-" and server.requests[1]["if_range"] is None
        assert server.bytes_sent == len(data)
    finally:
        server.close()


def test_a_length_less_file_is_whole_when_the_server_has_nothing_after_it(cache):
    data = os.urandom(50_000)
    server = FileServer({"c.bin": data}, length=False, etag=False)
    try:
        assert fetch(server.url("c.bin")).read_bytes() == data
        assert [r["range"] for r in server.requests] == [None, "bytes=50000-"]  # answered 416: nothing more
    finally:
        server.close()


def test_a_web_page_is_refused_as_a_corpus(cache, tmp_path):
    server = FileServer({"blob/corpus.txt": b"<!DOCTYPE html><html><body>corpus.txt</body></html>"},
                        content_type="text/html; charset=utf-8")
    url = server.url("blob/corpus.txt")
    try:
        with pytest.raises(DownloadError, match=re.escape(url) + r" is a web page \(Content-Type text/html\), not "
                                                                 "a corpus file"):
            fetch(url)
        assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".json")]
        done = subprocess.run([sys.executable, "-m", "tpu_pretrain", "vocab", "--input", url, "--output_dir",
                               str(tmp_path / "v")], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TPU_PRETRAIN_CACHE_DIR": str(cache)})
        assert done.returncode == 2 and "is a web page" in done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / "v" / "vocab.txt").exists()
    finally:
        server.close()


@pytest.mark.parametrize("content_type, page", [(None, b"\n<!DOCTYPE html>\n<html><body>Sign in</body></html>"),
                                                ("text/plain", b"\xef\xbb\xbf<HTML><head></head></HTML>")],
                         ids=["no-type", "text-plain"])
def test_a_web_page_served_without_its_type_is_refused_by_its_first_bytes(cache, content_type, page):
    """Issue 37, item 5: only text/html was refused; the page's own first bytes say what it is."""
    server = FileServer({"corpus.txt": page}, content_type=content_type)
    url = server.url("corpus.txt")
    said = "no Content-Type" if content_type is None else "Content-Type text/plain"
    try:
        with pytest.raises(DownloadError, match=re.escape(f"{url} is a web page ({said}, but it begins as an HTML "
                                                          "page does), not a corpus file")):
            fetch(url)
        assert not [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".json")]
    finally:
        server.close()


@pytest.mark.parametrize("server_kind", ["ignores-range", "chunked-without-validator", "resumable"])
def test_a_download_that_keeps_dropping_says_what_running_again_will_do(cache, monkeypatch, server_kind):
    """Issue 37, item 12: "run again to continue" only where a re-run really continues."""
    import tpu_pretrain.storage.download as download

    monkeypatch.setattr(download, "ATTEMPTS", 2)  # two attempts, one pause of 2 s between them
    data = os.urandom(400_000)
    options = {"ignores-range": dict(ranges=False), "chunked-without-validator": dict(chunked=True, etag=False),
               "resumable": dict(chunk=1000, delay=0.0)}[server_kind]
    server = FileServer({"c.bin": data}, cut_every=150_000, **options)
    url = server.url("c.bin")
    try:
        with pytest.raises(DownloadError) as stopped:
            fetch(url)
    finally:
        server.close()
    said = " ".join(str(stopped.value).split())
    if server_kind == "resumable":  # two attempts of 150,000 bytes each, the second continuing the first
        assert "run again to continue from the 300000 bytes already here" in said, said
    else:
        assert "running again fetches it from the start" in said and "cannot be continued" in said, said
        assert ("ignores Range requests" if server_kind == "ignores-range" else "neither the file's length nor a "
                "validator") in said
        assert "continue from" not in said
