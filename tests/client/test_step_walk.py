"""One verification step walked from the client's loop to the server's forward and back, over real gRPC on
loopback (tiny models, the independent drafter, the pipelined loop), with the modules it enters counted from the
running code (``support.step_walk``: a profiler hook on every thread). The count is printed (``pytest -s``) and
held to a ceiling, so a structure change that spreads one step over more modules fails here."""
from __future__ import annotations

from support.servers import running_server
from support.step_walk import StepWalk

from edgespec.client.loop.generation import GenerationConfig

STEP = ("edgespec.client.loop.generation", "_online_step")  # Generation._online_step
CEILING = 33  # 31 measured on all threads (15 on the client's; the float32 linears' shared.packed_weights one of
# them): 2 of slack for paths that hang on timing


def test_one_step_walks_both_sides_within_the_ceiling(tiny_model_dir, make_client, capsys):
    walk = StepWalk(STEP, nth=3)  # a step in the steady state: not the first after Open
    walk.start()
    try:
        with running_server(tiny_model_dir, http_port=None) as server:
            client = make_client(server.address, "independent")
            client.generate(client.encode("def add(a, b):\n    return a + b\n"),
                            GenerationConfig(max_new_tokens=24, ignore_eos=True))
    finally:
        walk.stop()
    assert walk.closed, "the generation ran fewer than 3 online steps"
    report = walk.report()
    with capsys.disabled():
        print("\n" + report)
    modules = walk.all_modules()
    # both sides were followed: the client's loop and link, the server's service and its forward
    for needed in ("edgespec.client.loop.generation", "edgespec.client.link.verifier", "edgespec.server.session"):
        assert needed in modules, (needed, report)
    assert any(".engine" in m for m in modules), report
    assert len(modules) <= CEILING, report
