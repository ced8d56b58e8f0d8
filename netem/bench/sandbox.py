"""Run untrusted generated code (HumanEval completions) in a sandboxed subprocess.

The program runs in a fresh interpreter (-I: no user site, no PYTHON* env),
in its own process group, in a scratch directory that is deleted afterwards,
with limits on wall time, CPU time, address space, file size and open files,
and without network: where the kernel lets us (root, or unprivileged user
namespaces) it gets a network namespace of its own with no interfaces;
otherwise socket creation is disabled inside the interpreter before the
program starts. Whatever the program does (loop forever, allocate 10 GB, crash
the interpreter, fork and hang) the caller gets a SandboxResult, never an
exception or a hang.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock for the whole program
    memory_bytes: int = 1 << 30  # address space (RLIMIT_AS)
    file_bytes: int = 16 << 20  # largest file it may write
    open_files: int = 64


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # exit status 0 within the limits
    status: str  # "passed", "failed", "timeout", "memory", "crashed"
    returncode: int | None
    seconds: float
    stderr_tail: str  # last lines of stderr, to say why it failed


# Runs first inside the child, before the program: the limits, a private network namespace where the
# kernel allows one, and no sockets whatever the namespace situation. The child sets its own limits
# (rather than a preexec_fn in the parent) because a preexec_fn forces fork(), and fork() in a process
# with gRPC threads can hang in gRPC's fork handlers: the harness did, mid-run. Without one, Popen
# starts the child with vfork/exec, which runs no fork handlers.
_PRELUDE = textwrap.dedent("""
    import resource as _r
    _r.setrlimit(_r.RLIMIT_AS, ({memory}, {memory}))
    _r.setrlimit(_r.RLIMIT_CPU, ({cpu}, {cpu}))
    _r.setrlimit(_r.RLIMIT_FSIZE, ({files}, {files}))
    _r.setrlimit(_r.RLIMIT_NOFILE, ({open_files}, {open_files}))
    _r.setrlimit(_r.RLIMIT_CORE, (0, 0))
    try:
        import ctypes as _c, os as _o
        _c.CDLL(None, use_errno=True).unshare({newnet} if _o.geteuid() == 0 else {newnet} | {newuser})
        del _c, _o
    except Exception:
        pass  # best effort: the lines below block sockets either way
    import socket as _s
    def _no_network(*a, **k):
        raise OSError("network access is disabled in the edgespec sandbox")
    _s.socket = _no_network
    _s.create_connection = _no_network
    _s.getaddrinfo = _no_network
    del _s, _r
""")

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Execute `source` as a Python program under the sandbox; exit status 0 means passed."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edgespec-sandbox-") as scratch:
        path = os.path.join(scratch, "program.py")
        with open(path, "w") as f:
            f.write(_PRELUDE.format(memory=limits.memory_bytes, cpu=int(limits.timeout_s) + 1, files=limits.file_bytes,
                                    open_files=limits.open_files, newnet=_CLONE_NEWNET, newuser=_CLONE_NEWUSER)
                    + "\n" + source)
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-I", "-B", path], cwd=scratch, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            _, err = proc.communicate(timeout=limits.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            _, err = proc.communicate()
        _kill_group(proc)  # children it left behind
    seconds = time.monotonic() - start
    tail = "\n".join(err.decode("utf-8", "replace").strip().splitlines()[-5:])
    rc = proc.returncode
    if timed_out or rc == -signal.SIGXCPU:
        status = "timeout"
    elif rc == 0:
        status = "passed"
    elif "MemoryError" in tail:
        status = "memory"
    elif rc is not None and rc < 0:
        status = "crashed"
    else:
        status = "failed"
    return SandboxResult(status == "passed", status, rc, seconds, tail)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def program_from_response(problem: dict, response: str) -> str:
    """The program to run for a chat model's answer.

    Instruct models answer with prose around a fenced code block, usually the
    whole function again. Take the first block that defines the entry point (or
    the first block, or the raw text); if it defines the function, run it after
    the prompt's imports, else treat it as the body that continues the prompt.
    """
    blocks = _FENCE.findall(response) or [response]
    defines = re.compile(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", re.M)
    code = next((b for b in blocks if defines.search(b)), blocks[0])
    if defines.search(code):
        imports = "\n".join(line for line in problem["prompt"].splitlines()
                            if line.startswith(("import ", "from ")))
        body = imports + "\n" + code
    else:
        body = problem["prompt"] + code
    return body + "\n\n" + problem["test"] + "\n\n" + f"check({problem['entry_point']})\n"


def score_response(problem: dict, response: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """pass@1 of one chat answer to a HumanEval problem."""
    return run_program(program_from_response(problem, response), limits)
