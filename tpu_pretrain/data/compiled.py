"""numba's ``njit`` with its on-disk cache, kept working when the cache cannot be: every compiled kernel uses it.

Why: numba refuses at import when no folder can hold its cache (the package read-only and HOME unwritable: "no
locator available"), and fails at the first call when a cache file is damaged (a truncated write: "pickle data
was truncated"); either killed every create-data worker at its start. Here a missing cache folder falls back to a
folder in the system's temporary directory (else the code is compiled in memory at each start), and a damaged
cache file is rebuilt; each is said in a line. A compile (the cache cold: a machine's first create-data, a new
version of the code) takes about 40 s on two cores: it is said in a line before it starts, once however many worker
processes compile at the same time (:func:`share_notice`), and never when the cache holds the code.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile

import numba
from numba.core import config as numba_config

log = logging.getLogger(__name__)

_cache_ok: bool | None = None  # whether compiled code can be cached (decided once per process)
_notice: dict = {"said": False, "shared": None}  # the compile notice: said here, and the flag workers share

COMPILING = "Compiling the fast tokenizer and masking paths ({when}, about 40 s on two cores)..."


def njit(**options):
    """``numba.njit(cache=True, **options)``, cached where a folder allows it, a damaged cache file rebuilt."""

    def decorate(function):
        dispatcher = numba.njit(cache=_cache_usable(), **options)(function)
        _rebuild_when_damaged(dispatcher)
        return dispatcher

    return decorate


def _probe():  # decorated once to ask numba whether it finds a folder for the cache of this package's code
    return 0


def _cache_usable() -> bool:
    global _cache_ok
    if _cache_ok is None:
        _cache_ok = _locate_cache()
    return _cache_ok


def _locate_cache() -> bool:
    """numba's own folders (NUMBA_CACHE_DIR, beside the package, its user cache), else a temporary folder."""
    try:
        numba.njit(cache=True)(_probe)
        return True
    except RuntimeError as exc:
        if "no locator available" not in str(exc):
            raise
    if os.environ.get("NUMBA_CACHE_DIR"):
        log.warning("NUMBA_CACHE_DIR=%s cannot hold the compiled code's cache (not writable): compiling in memory "
                    "at each start instead. Set it to a writable folder.", os.environ["NUMBA_CACHE_DIR"])
        return False
    folder = os.path.join(tempfile.gettempdir(), f"tpu_pretrain-numba-cache-{os.getuid()}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        log.warning("No writable folder for the compiled code's cache (beside %s, in HOME, or %s: %s): compiling in "
                    "memory at each start instead. Set NUMBA_CACHE_DIR to a writable folder to keep it.",
                    os.path.dirname(__file__), folder, exc.strerror or exc)
        return False
    numba_config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"] = folder  # also for the processes this one starts
    log.warning("No writable folder for the compiled code's cache beside %s or in HOME: caching it in %s. Set "
                "NUMBA_CACHE_DIR to a writable folder of your choice to keep it elsewhere.",
                os.path.dirname(__file__), folder)
    try:
        numba.njit(cache=True)(_probe)
        return True
    except RuntimeError:
        return False


def share_notice(flag: str | None) -> None:
    """Say the compile notice only in the process that creates ``flag`` (a file path the worker processes share):
    one line for create-data's workers compiling at once, not one each."""
    _notice["shared"] = flag


def _say_compiling() -> None:
    """The line before a compile (numba found no cached code): once per process, or per pool (:func:`share_notice`)."""
    if _notice["said"]:
        return
    _notice["said"] = True
    shared = _notice["shared"]
    if shared is not None:
        try:
            os.close(os.open(shared, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    when = "once per install" if _cache_ok else "at each start: no folder can keep the compiled code"
    print(COMPILING.format(when=when), file=sys.stderr, flush=True)  # a worker process has no logging set up


def _rebuild_when_damaged(dispatcher) -> None:
    """A cache file that cannot be read (truncated, damaged) is emptied and the code compiled and cached again."""
    cache = getattr(dispatcher, "_cache", None)
    load = getattr(cache, "load_overload", None)
    if load is None or not hasattr(cache, "flush"):  # no cache (compiled in memory), or another numba
        return

    def load_or_rebuild(signature, target_context):
        try:
            loaded = load(signature, target_context)
        except Exception as exc:  # the file's contents, whatever they are, are not a cache entry
            log.warning("The compiled code's cache of %s in %s is damaged (%s: %s): it is rebuilt.",
                        dispatcher.py_func.__qualname__, cache.cache_path, type(exc).__name__, exc)
            cache.flush()  # an empty index: compiled now, then saved over the damaged files
            loaded = None
        if loaded is None:  # not in the cache: numba compiles it next
            _say_compiling()
        return loaded

    cache.load_overload = load_or_rebuild
