"""Loaded by every Python process of a notebook test (the kernel and the steps it starts): records any file
or folder a notebook touches under the test's root outside its own folder and the durable places, which is
how the test knows a notebook used only what survives a runtime (Drive, buckets, Kaggle inputs)."""

import os
import sys

_ROOT = os.environ.get("NOTEBOOK_AUDIT_ROOT")
if _ROOT:
    _ROOT = os.path.realpath(_ROOT)
    _ALLOWED = [os.path.realpath(p) for p in os.environ["NOTEBOOK_AUDIT_ALLOW"].split(os.pathsep) if p]
    _LOG = os.environ["NOTEBOOK_AUDIT_LOG"]
    _busy = False

    def _inside(path, folder):
        return path == folder or path.startswith(folder + os.sep)

    def _audit(event, args):
        global _busy
        if _busy or event not in ("open", "os.listdir", "os.scandir") or not args:
            return
        target = args[0]
        if not isinstance(target, str | bytes | os.PathLike):
            return
        _busy = True
        try:
            path = os.path.realpath(os.fsdecode(target))
            if _inside(path, _ROOT) and not any(_inside(path, folder) for folder in _ALLOWED):
                with open(_LOG, "a", encoding="utf-8") as log:
                    log.write(f"{event} {path} (pid {os.getpid()}: {' '.join(sys.argv[:3])})\n")
        finally:
            _busy = False

    sys.addaudithook(_audit)
