"""Corpus files named by URL (``https://``, ``http://``, ``gs://``), fetched once into the local cache.

A corpus of tens of gigabytes is read several times (vocab, create-data), so it is fetched once: into
``<cache>/downloads/<hash of the URL>/<file name>``, under a ``.part`` name while it arrives. An HTTP
download that stops (a dropped connection, a killed process) continues where it stopped with a Range
request; ``If-Range`` with the server's ETag (or Last-Modified) makes a server whose file changed send
it whole again instead of a mix (without either, the file's total size must match). A response without
a length is whole only once the server has nothing after it. An HTML page is refused. The file appears
under its final name only when complete, so a re-run finds it and fetches nothing. ``gs://`` objects
come through :mod:`.transfer` (verified, skipped when identical). A checksum the user gives as a URL
fragment (``#sha256=<hex>`` or ``#md5=<hex>``, as pip writes them) is checked on the complete file; a
mismatch names the URL.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..environment import environment_override
from ..errors import UserInputError

log = logging.getLogger(__name__)

REMOTE_SCHEMES = ("http://", "https://", "gs://")
CHECKSUM_RE = re.compile(r"^(sha256|sha1|md5)=([0-9a-fA-F]+)$")
BLOCK = 1 << 20
ATTEMPTS = 5
TIMEOUT_SECONDS = 60


class DownloadError(UserInputError):
    """A URL could not be fetched, or what arrived is not what its checksum says; the message names the URL."""


def is_remote(item: str) -> bool:
    return str(item).startswith(REMOTE_SCHEMES)


def cache_folder() -> Path:
    """Where downloads are kept: ``TPU_PRETRAIN_CACHE_DIR/downloads`` (default ``~/.cache/tpu_pretrain``)."""
    root = environment_override("TPU_PRETRAIN_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu_pretrain"
    return base / "downloads"


def split_checksum(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without its fragment, and the (algorithm, hex digest) the fragment names, if any."""
    base, _, fragment = url.partition("#")
    if not fragment:
        return base, None
    match = CHECKSUM_RE.match(fragment)
    if not match:
        raise DownloadError(f"The fragment of {url} is not a checksum: write it as #sha256=<hex> or #md5=<hex>.")
    return base, (match.group(1), match.group(2).lower())


def cached_path(url: str, cache: Path | None = None) -> Path:
    """Where ``url`` (without its checksum fragment) is kept once fetched."""
    name = os.path.basename(urllib.parse.urlparse(url).path) or "download"
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    return (cache or cache_folder()) / key / name


def fetch(url: str, cache: Path | None = None, progress: bool | None = None) -> Path:
    """The local path of ``url``'s file, fetched into the cache unless it is there whole already."""
    base, checksum = split_checksum(url)
    dest = cached_path(base, cache)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if base.startswith("gs://"):
        from . import copy

        copy(base, dest, progress=bool(progress))  # verified by crc32c; skipped when identical
    elif not dest.is_file():
        _http_download(base, dest, progress)
    else:
        log.info("Using %s, fetched before from %s.", dest, base)
    if checksum:
        _check(base, dest, *checksum)
    return dest


def _check(url: str, path: Path, algorithm: str, expected: str) -> None:
    got = file_digest(path, algorithm)
    if got != expected:
        raise DownloadError(
            f"{url}: the downloaded file's {algorithm} is {got}, not the {expected} given. If the checksum given "
            f"is wrong, correct it (nothing is fetched again); if the file on the server changed or arrived "
            f"damaged, delete {path} and run again to fetch it anew.")


def file_digest(path: Path, algorithm: str) -> str:
    """The file's digest, remembered beside it (by size and time) so a re-run does not read it again."""
    memo = path.with_name(path.name + ".digests.json")
    stat = path.stat()
    stamp = [stat.st_size, stat.st_mtime_ns]
    known = _read_json(memo)
    if known.get("stamp") == stamp and algorithm in known:
        return known[algorithm]
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(BLOCK):
            digest.update(chunk)
    known = {**(known if known.get("stamp") == stamp else {}), "stamp": stamp, algorithm: digest.hexdigest()}
    memo.write_text(json.dumps(known))
    return known[algorithm]


def _http_download(url: str, dest: Path, progress: bool | None) -> None:
    """Fetch ``url`` to ``dest`` through ``dest.part``, resuming a partial file; retried on dropped connections."""
    part = dest.with_name(dest.name + ".part")
    for attempt in range(1, ATTEMPTS + 1):
        try:
            if _fetch_part(url, part, progress):
                break
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as exc:
            if isinstance(exc, urllib.error.HTTPError) and exc.code < 500:
                raise DownloadError(f"{url} cannot be fetched: HTTP {exc.code} {exc.reason}.") from None
            if attempt == ATTEMPTS:
                raise DownloadError(f"{url} cannot be fetched after {ATTEMPTS} attempts ({exc!r}); "
                                    f"{_what_a_rerun_does(part)}") from None
            log.warning("Download of %s stopped (%r); continuing (attempt %d of %d).", url, exc, attempt + 1,
                        ATTEMPTS)
            time.sleep(min(30, 2 ** attempt))
    else:
        raise DownloadError(f"{url}: {ATTEMPTS} attempts could not confirm that the file arrived whole (the server "
                            "sends no length, or the file changes between requests). Add its checksum (#sha256=<hex>) "
                            "to the URL, or download it yourself and give the local file.")
    os.replace(part, dest)
    part.with_name(part.name + ".json").unlink(missing_ok=True)


def _what_a_rerun_does(part: Path) -> str:
    """What running the command again will really do with the bytes already here: continue, or start over."""
    have = part.stat().st_size if part.exists() else 0
    meta = _read_json(part.with_name(part.name + ".json"))
    if not have:
        return "run again to fetch it once the server or the connection is back."
    if meta.get("ranges") is False:
        why = "the server ignores Range requests (asked for the rest, it sent the whole file)"
    elif not (meta.get("validator") or meta.get("size") or meta.get("unsized")):
        why = ("the server sent neither the file's length nor a validator (ETag, Last-Modified), so bytes fetched "
               "later could not be checked to belong to the same file")
    else:
        return f"run again to continue from the {have} bytes already here."
    return (f"running again fetches it from the start, since {why}: the {have} bytes here cannot be continued. "
            "On a connection this unsteady, download it with another tool and give the local file.")


def _fetch_part(url: str, part: Path, progress: bool | None) -> bool:
    """Append the rest of ``url`` to ``part`` (or start it over); True when ``part`` is known to be complete.

    A partial file continues with a Range request; ``If-Range`` (ETag or Last-Modified) makes a changed file come
    whole, and without one the total size in ``Content-Range`` must match. A response without a length that ends
    (the connection closed: the end, or a cut) is confirmed by asking for the bytes after it: none (416) is whole.
    """
    meta_file = part.with_name(part.name + ".json")
    meta = _read_json(meta_file)
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "tpu-pretrain", "Accept-Encoding": "identity"}
    if have and (meta.get("validator") or meta.get("size") or meta.get("unsized")):
        headers["Range"] = f"bytes={have}-"
        if meta.get("validator"):
            headers["If-Range"] = meta["validator"]
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as exc:
        if exc.code != 416 or not have:
            raise
        if _range_total(exc) in (None, have) and meta.get("size") in (None, have):
            return True  # nothing after the bytes here: the partial file was already whole
        return _start_over(part, meta_file)  # the file on the server is shorter now: another file
    with response:
        _refuse_web_page(url, response)
        stated = _range_total(response)
        continuing = response.status == 206 and _range_start(response) == have and (
            stated is None or meta.get("size") in (None, stated))
        if response.status == 206 and not continuing:
            return _start_over(part, meta_file)  # another range, or the file changed size: fetch it whole
        if continuing:
            length = response.headers.get("Content-Length")
            total = have + int(length) if length else _range_total(response) or meta.get("size")
            log.info("Continuing the download of %s at byte %d.", url, have)
        else:  # the whole file: a fresh start, a server without ranges, or one whose file changed
            length = response.headers.get("Content-Length")
            total = int(length) if length else None
            validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
            ignored = "Range" in headers and headers.get("If-Range") in (None, validator)  # the same file, whole
            meta = {"url": url, "validator": validator, "size": total, "whole": meta.get("whole"),
                    "ranges": False if ignored else meta.get("ranges")}
            meta_file.write_text(json.dumps(meta))
        _receive(response, part, "ab" if continuing else "wb", have if continuing else 0, total, progress)
        chunked = response.chunked  # a chunked body that ends early raises IncompleteRead: one that ends is whole
    size = part.stat().st_size
    if total is not None and size != total:
        raise ConnectionError(f"the connection closed after {size} of {total} bytes")
    if total is not None or chunked or (not continuing and meta.get("whole") == size):
        return True  # known complete (the last: two whole responses without a length agree)
    log.info("%s came without a length; asking for what follows byte %d to be sure it is whole.", url, size)
    meta_file.write_text(json.dumps({**meta, "unsized": True, "whole": meta.get("whole") if continuing else size}))
    return False


def _start_over(part: Path, meta_file: Path) -> bool:
    part.unlink(missing_ok=True)
    meta_file.unlink(missing_ok=True)
    return False


def _receive(response, part: Path, mode: str, have: int, total: int | None, progress: bool | None) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=os.path.basename(part.name[:-5]),
               disable=(not progress) if progress is not None else None)
    with open(part, mode) as out, bar:
        while chunk := response.read1(BLOCK):  # what has arrived: a stop keeps it
            out.write(chunk)
            bar.update(len(chunk))
        out.flush()
        os.fsync(out.fileno())


def _refuse_web_page(url: str, response) -> None:
    """An HTML page is not a corpus (a GitHub "blob" link, a sign-in page): refused before a byte is kept, whether
    the server says so (Content-Type) or only its first bytes do (no type, or text/plain)."""
    kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if kind in ("text/html", "application/xhtml+xml"):
        what = f"Content-Type {kind}"
    elif response.status == 200 and _starts_like_html(response.peek(512)[:512]):
        what = f"{'Content-Type ' + kind if kind else 'no Content-Type'}, but it begins as an HTML page does"
    else:
        return
    parsed = urllib.parse.urlparse(url)
    hint = "Give the address of the file itself (a download or \"raw\" link)."
    if parsed.netloc == "github.com" and "/blob/" in parsed.path:
        raw = f"https://raw.githubusercontent.com{parsed.path.replace('/blob/', '/', 1)}"
        hint = f"That is GitHub's page about the file; the file itself is {raw}"
    raise DownloadError(f"{url} is a web page ({what}), not a corpus file: its markup would be read as text. {hint} "
                        "(To train on markup after all, download it yourself and give the local file.)")


def _starts_like_html(head: bytes) -> bool:
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip().lower()
    return text.startswith((b"<!doctype html", b"<html"))


def _range_start(response) -> int | None:
    match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _range_total(response) -> int | None:
    """The file's whole size that ``Content-Range`` states (``bytes 0-9/10``, ``bytes */10``), if it does."""
    match = re.search(r"/(\d+)\s*$", response.headers.get("Content-Range", "") if response.headers else "")
    return int(match.group(1)) if match else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
