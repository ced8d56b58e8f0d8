"""The server's load price: what one more tree node costs the items sharing its forwards (pure, and from a real
server's scheduler under concurrent sessions)."""
from __future__ import annotations

import threading

import pytest
from support.servers import running_server

from edgespec.proto.edgespec.v1 import pb
from edgespec.server.load_price import LoadPrice, Price, Totals, price_of
from edgespec.shared.tree import DraftTree, encode_tree


def test_the_price_is_the_time_above_a_lone_step_per_row_and_never_below_the_curves_slope():
    # 10 forwards of 40 rows and 4 items, 9 ms each, over a lone decode step of 5 ms: (9 - 5) / 40 = 0.1 ms a row
    got = price_of(Totals(10, 40, 400, 90_000_000), floor_ns=5e6, slope_ns=20_000)
    assert got == Price(100_000, 4.0)
    assert price_of(Totals(10, 10, 20, 50_000_000), floor_ns=5e6, slope_ns=20_000) == Price(20_000, 1.0)  # alone
    assert price_of(Totals(), 5e6, 20_000) == Price(20_000, 1.0)  # nothing ran yet


def test_the_running_price_moves_once_a_window_of_forwards_ran():
    price = LoadPrice(window=4)
    price.calibrate((0, 4, 16), (5_000_000, 5_400_000, 6_600_000))  # slope 100 us a node
    assert price.now() == Price(100_000, 1.0)
    assert price.update(Totals(3, 24, 240, 30_000_000)) == Price(100_000, 1.0)  # 3 forwards: not yet
    moved = price.update(Totals(4, 32, 320, 40_000_000))  # 10 ms a forward of 80 rows, 8 items: 62.5 us a row
    assert moved == Price(100_000, 8.0) and price.now() == moved  # ... but never below the lone session's slope
    dear = price.update(Totals(8, 96, 1_120, 140_000_000))  # 4 more: 25 ms a forward of 200 rows, 16 items
    assert dear == Price(100_000, 16.0)  # (25 - 5) / 200 = 100 us
    dearer = price.update(Totals(12, 224, 1_520, 260_000_000))  # 4 more: 30 ms, 100 rows, 32 items
    assert dearer == Price(250_000, 32.0)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with running_server(tiny_model_dir, http_port=None, max_sessions=32) as handle:
        yield handle


def _session(channel, fingerprint, sid: str, steps: int, out: list) -> None:
    from edgespec.proto.edgespec.v1 import pb_grpc

    stub = pb_grpc.VerifierStub(channel)
    requests = [pb.ClientMessage(open=pb.Open(session_id=sid, prompt_ids=[1, 2, 3], tokenizer_fingerprint=fingerprint,
                                              max_new_tokens=4096))]
    requests += [pb.ClientMessage(draft=pb.Draft(session_id=sid, step=k + 1, committed_len=4 + k,
                                                 tree=encode_tree(DraftTree.chain([258] * 8)))) for k in range(steps)]
    for reply in stub.Session(iter(requests)):
        if reply.HasField("verified"):
            out.append(reply.verified.timings)


def test_a_loaded_server_prices_its_rows_and_a_lone_session_sees_no_sharing(server):
    import grpc

    from edgespec.shared.fingerprint import tokenizer_fingerprint

    fingerprint = tokenizer_fingerprint(server.core.target.tokenizer)
    server.core.load_price.window = 8
    with grpc.insecure_channel(server.address) as channel:
        alone: list = []
        _session(channel, fingerprint, "alone", 20, alone)
        assert alone and all(t.sharing == pytest.approx(1.0) for t in alone)
        crowd: list[list] = [[] for _ in range(8)]
        threads = [threading.Thread(target=_session, args=(channel, fingerprint, f"s{i}", 40, crowd[i]))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    late = [t for got in crowd for t in got[-10:]]
    assert max(t.sharing for t in late) > 1.5  # the forwards held several sessions at once
    assert all(t.row_cost_ns > 0 for t in late)
