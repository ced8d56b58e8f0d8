"""A limit on the interpreter's teardown once a command has done its work.

When an `edgespec` command returns, its output is complete and its exit status known; what is left is
Python's own teardown: joining non-daemon threads, the atexit handlers (concurrent.futures joins its
workers there) and gRPC's core closing what is still open. Should that wedge, a script waiting on the
process would wait for nothing: a one-shot `edgespec client` that had printed its text and metrics once
sat two minutes in teardown until a test killed it. So the process entry arms two cut-offs after the
command returns:

- a daemon timer that, after `seconds`, writes every thread's stack to stderr (what held the exit) and
  ends the process with the command's own status;
- faulthandler's watchdog at twice that, a C thread that needs no GIL, for a teardown wedged where Python
  threads no longer run; it ends the process with status 1.

A teardown that finishes first cancels nothing and prints nothing: the process is simply gone. Only the
process entry arms this; ``main()`` called in-process (tests) never does.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading

TEARDOWN_LIMIT_S = 30.0  # a normal teardown (torch, gRPC, tokenizers loaded) takes well under a second


def limit_teardown(status: int, seconds: float = TEARDOWN_LIMIT_S) -> None:
    """Arm the cut-offs for a process whose command returned `status` (call it just before exiting)."""
    _flush()
    faulthandler.dump_traceback_later(2 * seconds, exit=True)
    timer = threading.Timer(seconds, _cut, args=(status, seconds))
    timer.daemon = True  # must not itself be a thread the teardown waits for
    timer.start()


def _cut(status: int, seconds: float) -> None:
    try:
        print(f"edgespec: the process did not exit within {seconds:g}s of finishing its work; its output is "
              "complete. What held it (every thread's stack):", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        _flush()
    finally:
        os._exit(status)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to flush into
            pass
