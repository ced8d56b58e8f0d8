"""The OpenAI-compatible HTTP layer that both edgespec APIs share.

The server's plain API (the target generating alone, the baseline) and the
client's local API (``edgespec client serve``, generating speculatively) are
one FastAPI app shape (``routes``, which lists the steps a request takes) over
two ``backend``s, so a request means the same thing on both and is refused the
same way.
"""
