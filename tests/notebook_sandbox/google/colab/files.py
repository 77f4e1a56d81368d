from . import record


def download(path):
    record(f"files.download {path}")
