import os
import signal
import time

import pytest

from tpu_pretrain.core import session


def test_signals_ask_for_a_clean_stop_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    guard = session.SessionGuard(deadline=None)
    try:
        assert guard.should_stop() is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.should_stop() == "SIGTERM received"
        with pytest.raises(KeyboardInterrupt):  # after a stop request, Ctrl-C aborts at once
            guard._on_signal(signal.SIGINT, None)
    finally:
        guard.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_deadline_counts_the_margin_and_the_next_chunk():
    guard = session.SessionGuard(deadline=time.time() + 100, margin_seconds=30, handle_signals=False)
    assert guard.should_stop(next_chunk_seconds=10) is None
    assert "session ends" in guard.should_stop(next_chunk_seconds=80)


def test_session_deadline_by_platform(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.setattr(session, "runtime", lambda: "kaggle")
    start = session.runtime_started_at()
    assert session.session_deadline(0) == pytest.approx(start + 9 * 3600)
    assert session.session_deadline(-1) is None
    assert session.session_deadline(2) == pytest.approx(time.time() + 7200, abs=5)
    monkeypatch.setattr(session, "runtime", lambda: "local")
    assert session.session_deadline(0) is None

