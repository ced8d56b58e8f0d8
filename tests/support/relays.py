"""netem's relay (RelayThread) in front of a test's server: the link the tests cut and restore.

    with relay_to(server) as relay:        # relay.target: "host:port" for the client
        relay.cut("blackhole")             # bytes stop, sockets stay open; held bytes go on after restore
        relay.cut("reset")                 # open connections get a TCP reset, new ones too while it lasts
        relay.restore()
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator


@contextlib.contextmanager
def relay_to(server, profile: str = "ideal") -> Iterator:
    """A started RelayThread shaped by `profile` in front of `server` (anything with a `port` on loopback)."""
    from edgespec.netem.profile import load_profile
    from edgespec.netem.relay_thread import RelayThread

    with RelayThread(load_profile(profile), upstream=("127.0.0.1", server.port), seed=0) as relay:
        yield relay


def drive(gen, relay, cut_at: int, restore_after: int | None):
    """Consume a generation; blackhole the relay after `cut_at` tokens, restore it after `restore_after`
    offline tokens (None: never). Returns the generation's result."""
    from edgespec.client.loop.generation import TokenEvent, TokenOrigin

    offline = 0
    for e in gen:
        if isinstance(e, TokenEvent):
            if e.index + 1 == cut_at and e.origin is not TokenOrigin.OFFLINE and relay.state == "up":
                relay.cut("blackhole")
            if e.origin is TokenOrigin.OFFLINE:
                offline += 1
                time.sleep(0.02)
                if restore_after is not None and offline >= restore_after:
                    relay.restore()
    return gen.result
