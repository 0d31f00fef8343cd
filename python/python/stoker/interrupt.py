"""Ctrl-C while a loop waits for data, never lost.

Python runs a SIGINT handler at the next point the main thread executes Python code. When that
point is a finalizer (a ``__del__``, a generator the garbage collector closes), the
``KeyboardInterrupt`` is printed as "Exception ignored" and dropped; a loop that then waits for a
batch would wait out its whole timeout. While a loader is iterated on the main thread, and only
where SIGINT has Python's default handler, :func:`watching` puts a handler in its place that
counts the signal in the native module and then raises as the default one does; the loader's wait
raises ``KeyboardInterrupt`` itself when the count moved since its loop last had control. A
handler of the user's own (a graceful-stop flag, say) is left alone.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from stoker import _stoker

__all__ = ["watching", "count"]

_lock = threading.Lock()
_depth = 0  # loops iterating under the counting handler
_installed = False


def count() -> int:
    """SIGINTs counted so far in this process."""
    return _stoker.interrupts()


def _counting_handler(signum: int, frame: Any) -> None:
    _stoker.note_interrupt()
    signal.default_int_handler(signum, frame)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def watching() -> Iterator[None]:
    """Count SIGINTs while the block runs (installed by the first of nested blocks on the main
    thread, put back by the last)."""
    global _depth, _installed
    with _lock:
        _depth += 1
        if not _installed and _on_main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _counting_handler)
            _installed = True
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            # Put back only from the main thread (a generator closed by the garbage collector on
            # another thread leaves it for the next block to end there) and only if nobody
            # replaced it meanwhile.
            if _depth == 0 and _installed and _on_main_thread():
                if signal.getsignal(signal.SIGINT) is _counting_handler:
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                _installed = False
