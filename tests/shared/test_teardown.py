"""The process entry's limit on teardown (shared/teardown.py), in real subprocesses: a teardown that wedges
ends with the command's status and says what held it; one that finishes is untouched."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_a_teardown_held_by_a_thread_ends_with_the_commands_status_and_its_stacks():
    proc = _python("""
        import sys, threading
        from edgespec.shared.teardown import limit_teardown

        def stuck_worker():
            threading.Event().wait()  # never set: Python's teardown joins this non-daemon thread forever

        threading.Thread(target=stuck_worker).start()
        print("the answer", flush=True)
        limit_teardown(7, seconds=0.5)
        sys.exit(7)
    """)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "the answer\n"
    assert "did not exit within 0.5s" in proc.stderr
    assert "stuck_worker" in proc.stderr  # the stack that held the exit is named


def test_a_teardown_wedged_with_the_gil_held_is_ended_by_the_c_watchdog():
    # an atexit handler stuck in C with the GIL held: the Python timer cannot run, faulthandler's thread can
    proc = _python("""
        import atexit, re, sys
        from edgespec.shared.teardown import limit_teardown

        atexit.register(lambda: re.match(r"(a+)+$", "a" * 64 + "b"))  # backtracks for ages without the GIL free
        limit_teardown(0, seconds=0.5)
        sys.exit(0)
    """)
    assert proc.returncode == 1
    assert "Timeout (0:00:01)!" in proc.stderr


def test_a_teardown_that_finishes_keeps_its_status_and_prints_nothing():
    proc = _python("""
        import sys
        from edgespec.shared.teardown import limit_teardown

        print("done")
        limit_teardown(3, seconds=20)
        sys.exit(3)
    """)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "done\n", "")
