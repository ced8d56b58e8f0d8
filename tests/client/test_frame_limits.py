"""Feature frames are decoded within what the answer can carry: its tokens x the session's feature width."""
from __future__ import annotations

import pytest
import torch

from edgespec.client.link.verifier import FeatureWidths, Verifier
from edgespec.shared.session_settings import FeatureRequest, SessionSettings
from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.codec import Codec, encode_frame, frame_element_limit
from edgespec.shared.errors import FrameError
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.wire import HIDDEN, FeatureKind


class ScriptedServer:
    """A transport whose server answers with the messages given (a hostile one, here)."""

    def __init__(self, *answers: pb.ServerMessage):
        self.answers = list(answers)

    def start(self, session_id): ...

    def request(self, message):
        return self.answers.pop(0)

    def send(self, message):
        return lambda: self.request(message)

    def disconnect(self, failures): ...

    def reconnected(self, timeout_s):
        return 0

    def close(self): ...


def test_the_limit_is_rows_times_width():
    assert frame_element_limit(3, 1536) == 4608 and frame_element_limit(0, 1536) == 0
    with pytest.raises(ValueError):
        frame_element_limit(-1, 4)
    widths = FeatureWidths(hidden_size=64, kv_size=16)
    assert widths.per_token(FeatureRequest()) == 0  # ngram, independent: no frames at all
    assert widths.per_token(FeatureRequest(FeatureKind.LAST_HIDDEN)) == 64
    assert widths.per_token(FeatureRequest(FeatureKind.MOA, "p", 0)) == 32  # LSA: 2 * E_kv
    assert widths.per_token(FeatureRequest(FeatureKind.MOA, "p", 4)) == 64  # TLI_K: N * E_kv


def test_a_small_frame_claiming_more_than_the_answer_can_carry_is_refused():
    bomb = encode_frame(torch.zeros(4, 1 << 20), Codec.INT8, 3)  # 4M elements, a few KiB on the wire
    assert len(bomb) < 16 << 10
    honest = encode_frame(torch.ones(3, 64), Codec.INT8, 3)
    spec = SessionSettings("s", features=FeatureRequest(FeatureKind.LAST_HIDDEN))
    opened = pb.ServerMessage(opened=pb.Opened(session_id="s", first_token=4, committed_len=4,
                                               features=[pb.Feature(name=HIDDEN, frame=honest)]))
    tree = DraftTree((5, 6), (ROOT, 0))

    def verified(frame):
        return pb.ServerMessage(verified=pb.Verified(session_id="s", step=1, accepted=[0, 1], bonus_token=7,
                                                     committed_len=7, features=[pb.Feature(name=HIDDEN, frame=frame)]))

    ok = Verifier(ScriptedServer(opened, verified(honest)), FeatureWidths(64, 16))
    assert ok.open(spec, (1, 2, 3)).features[HIDDEN].shape == (3, 64)
    assert ok.verify(1, 4, tree).features[HIDDEN].shape == (3, 64)  # root + 2 accepted: 3 rows of 64
    hostile = Verifier(ScriptedServer(opened, verified(bomb)), FeatureWidths(64, 16))
    hostile.open(spec, (1, 2, 3))
    with pytest.raises(FrameError, match="limit is 192"):  # 3 rows x 64 values
        hostile.verify(1, 4, tree)
