"""A stand-in for Colab's ``google.colab`` in notebook tests: the browser side of Colab cannot exist here.

Each call is recorded in the file named by ``FAKE_COLAB_LOG`` so a test can check what a notebook asked of
Colab; the code around these calls runs for real.
"""

import os


def record(what: str) -> None:
    path = os.environ.get("FAKE_COLAB_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(what + "\n")
