"""``--drafter moa``: Mixture of Attentions; its Layer Self-Attention runs on the server.

The server must hold the checkpoint's server part under the same name (``edgespec server
--moa-server-part moa-tli0`` for a shipped one, ``NAME=PATH`` for others): the client asks
for it by name and refuses to start when the server does not have it, because another
part's features would make the drafter guess blindly.
"""
from __future__ import annotations

from edgespec.shared.drafters.checkpoint import DrafterCheckpointError

from .base import FEATURE_MOA, FeatureNeeds
from .learned import LearnedDrafter
from .learned_loading import open_learned

DEFAULT_CHECKPOINT = "moa-tli0"


def from_options(options, server_info=None) -> LearnedDrafter:
    runtime, name, _ = open_learned("moa", options, server_info, DEFAULT_CHECKPOINT)
    part = options.moa_server_part or name
    if server_info is not None and part not in server_info.moa_server_parts:
        have = ", ".join(server_info.moa_server_parts) or "none"
        raise DrafterCheckpointError(
            f"the server has no MoA server part {part!r} (it has: {have}); start it with "
            f"--moa-server-part {part}" + ("" if part == name else "=PATH"))
    needs = FeatureNeeds(FEATURE_MOA, moa_server_part=part, tli_layers=runtime.parts.tli)
    return LearnedDrafter(f"moa-tli{runtime.parts.tli}", runtime, needs, options.tree)
