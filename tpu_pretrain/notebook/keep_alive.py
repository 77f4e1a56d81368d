"""The Colab keep-alive the old tutorials used, offered honestly.

Colab disconnects a tab it thinks is idle. The old tutorials pasted a script into the browser's console
that clicks the connect button now and then. Injected from a notebook cell it does nothing: cell output
runs in a sandboxed frame that may not touch the page. So this prints the script with instructions for
the console, and says what really protects the work: checkpoints mirrored to Drive or Cloud Storage, and
``05_resume``. Nothing can extend Colab's 12-hour limit.
"""

from __future__ import annotations

KEEP_ALIVE_JS = """\
// tpu_pretrain keep-alive: clicks Colab's connect button every %(seconds)d s. Unofficial: Colab may change
// its page at any time, and nothing extends the 12-hour limit. Stop it: clearInterval(window.__keepAlive)
window.__keepAlive = setInterval(function () {
  var button = document.querySelector("colab-connect-button");
  var inner = button && button.shadowRoot ? button.shadowRoot.querySelector("#connect") : null;
  (inner || button || {click: function () {}}).click();
}, %(seconds)d * 1000);"""


def keep_alive_script(seconds: int = 60) -> str:
    """The JavaScript to paste into the browser's console on the Colab tab."""
    return KEEP_ALIVE_JS % {"seconds": int(seconds)}


def keep_alive_instructions(seconds: int = 60) -> str:
    """How to use the keep-alive, and why resume, not the keep-alive, is what protects a run."""
    return (
        "Optional, unofficial keep-alive for Colab: open the browser's developer console on this tab (F12, or "
        "Ctrl+Shift+J / Cmd+Option+J), paste the script below and press Enter. It only works there: a notebook "
        "cell cannot reach Colab's page. It may stop working whenever Colab changes its page, and the session "
        "still ends after at most 12 hours. What protects the run is the checkpoints mirrored to your durable "
        "folder: after a disconnect, open 05_resume.\n\n" + keep_alive_script(seconds))
