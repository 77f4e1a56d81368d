"""Opening one corpus file: compression recognised by content, and files that are not text refused early.

A name says little (``.TXT.GZ``, a ``.gz`` that is a tar archive, a binary given by mistake), so the
first bytes decide: gzip, bzip2 and xz are decompressed whatever the file is called, a zip archive is
read member after member (each member ends a document, like a file); other archives (tar, 7z, rar)
and unsupported compression are refused with the command that unpacks them; a file whose start
holds NUL bytes, or lines that are mostly not valid text in the configured encoding, is refused
naming the file and ``--encoding``, before any slow work starts.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zipfile
import zlib

from ..errors import UserInputError

SNIFF_BYTES = 64 * 1024
MAX_UNDECODABLE_SHARE = 0.10  # of the sniffed lines; more means another encoding, or not text at all
MAX_UNDECODABLE_LINES = 2  # fewer are tolerated whatever the share (a tiny file with one broken line)
COMPRESSIONS = {b"\x1f\x8b": ("gzip", gzip.open), b"BZh": ("bzip2", bz2.open), b"\xfd7zXZ\x00": ("xz", lzma.open)}
UNSUPPORTED = {
    b"7z\xbc\xaf\x27\x1c": "a 7z archive: extract it (7z x) and give the folder",
    b"Rar!\x1a\x07": "a rar archive: extract it and give the folder",
    b"\x28\xb5\x2f\xfd": "zstd-compressed: decompress it (zstd -d) or recompress it with gzip",
    b"\x7fELF": "a program (ELF binary), not text",
    b"%PDF": "a PDF document: extract its text first (e.g. pdftotext)",
}
# Exceptions a damaged compressed stream (or a failing disk) raises part-way through; see read_error().
DAMAGED_STREAM = (EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, OSError)
ZIP_MAGIC = b"PK\x03\x04"


def open_corpus_file(path: str) -> io.BufferedIOBase:
    """A binary stream of the file's text, decompressed when the content says it is compressed."""
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head.startswith(ZIP_MAGIC):
        return io.BufferedReader(ZipMembers(path), buffer_size=1 << 20)
    for magic, (_, opener) in COMPRESSIONS.items():
        if head.startswith(magic):
            return opener(path, "rb")  # type: ignore[return-value]
    for magic, what in UNSUPPORTED.items():
        if head.startswith(magic):
            raise UserInputError(f"Corpus file {path} is {what}.")
    return open(path, "rb")


class ZipMembers(io.RawIOBase):
    """The files of a zip archive as one stream, in name order, a blank line after each (it ends a document)."""

    def __init__(self, path: str):
        self.archive = zipfile.ZipFile(path)
        self.members = sorted(info.filename for info in self.archive.infolist() if not info.is_dir())
        self.current = None
        self.pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            chunk = self.current.read(len(buffer)) if self.current else b""
            if chunk:
                self.pending = chunk
            elif self.current:
                self.current.close()
                self.current, self.pending = None, b"\n\n"
            elif self.members:
                self.current = self.archive.open(self.members.pop(0))
            else:
                return 0
        n = min(len(buffer), len(self.pending))
        buffer[:n], self.pending = self.pending[:n], self.pending[n:]
        return n

    def close(self) -> None:
        if self.current:
            self.current.close()
        self.archive.close()
        super().close()


def check_text_file(path: str, encoding: str) -> None:
    """Refuse, before the slow work, a corpus file that is an archive, binary, or mostly not ``encoding`` text."""
    try:
        with open_corpus_file(path) as handle:
            start = handle.read(SNIFF_BYTES)
    except DAMAGED_STREAM as exc:
        raise read_error(path, exc, "at its start") from None
    if len(start) > 262 and start[257:262] == b"ustar":
        raise UserInputError(f"Corpus file {path} is a tar archive: extract it (tar xf {path}) and give the folder.")
    if b"\x00" in start:
        raise UserInputError(
            f"Corpus file {path} holds NUL bytes: it is binary, or UTF-16/UTF-32 text. Give text files; convert "
            f"UTF-16 with `iconv -f UTF-16 -t UTF-8 {path}`.")
    lines = start.split(b"\n")
    if len(start) == SNIFF_BYTES:
        lines = lines[:-1]  # the last line may be cut inside a character
    lines = [line for line in lines if line.strip()]
    bad = sum(not _decodes(line, encoding) for line in lines)
    if bad > max(MAX_UNDECODABLE_LINES, MAX_UNDECODABLE_SHARE * len(lines)):
        raise UserInputError(
            f"Corpus file {path}: {bad} of the first {len(lines)} lines are not valid {encoding} text. If it is "
            f"text in another encoding, say which with --encoding (e.g. latin-1, cp1252, gbk, shift_jis); if it "
            "is not text, leave it out.")


def read_error(path: str, exc: BaseException, where: str) -> UserInputError:
    """A read that failed ``where`` in a corpus file: the disk or permissions (an errno), or damaged content."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return UserInputError(f"Corpus file {path} cannot be read {where}: {exc.strerror}.")
    return UserInputError(f"Corpus file {path} is damaged {where} ({type(exc).__name__}: {exc}): download or "
                          "compress it again.")


def _decodes(line: bytes, encoding: str) -> bool:
    try:
        line.decode(encoding)
        return True
    except UnicodeDecodeError:
        return False

