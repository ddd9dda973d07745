"""A thread paused inside a function at a chosen line, for the race tests: the other thread's
move lands exactly there."""

from __future__ import annotations

import sys
import threading
from typing import Callable


class Paused:
    """Runs ``call()`` in a thread that pauses before the ``pause_at``-th line event of
    ``code`` for which ``counts(frame)`` holds, until :meth:`resume`.  ``result`` holds what
    ``call`` returned."""

    def __init__(self, code, pause_at: int, call: Callable, counts: Callable = lambda frame: True):
        self.paused, self._resume, self.result = threading.Event(), threading.Event(), None
        lines = []

        def tracer(frame, event, arg):
            if frame.f_code is not code:
                return None

            def local(frame, event, arg):
                if event == "line" and counts(frame):
                    lines.append(frame.f_lineno)
                    if len(lines) == pause_at and not self.paused.is_set():
                        self.paused.set()
                        self._resume.wait(10)
                return local
            return local

        def run():
            sys.settrace(tracer)
            try:
                self.result = call()
            finally:
                sys.settrace(None)
                self.paused.set()

        self._thread = threading.Thread(target=run)
        self._thread.start()
        self.paused.wait(10)

    def resume(self) -> None:
        """Let the thread go on, and wait for it."""
        self._resume.set()
        self._thread.join(10)
