"""The names and numbers of the wire contract (``proto/edgespec/v1``) that both sides write in code.

Each is defined here once, as plain Python, so that the drafters, the generation
loop and the server's domain code name them without importing protobuf; a test
holds every one of them equal to the ``.proto`` (enum names and numbers, and the
names its comments fix). ``Codec`` lives with the activation codec
(``edgespec.shared.codec``), which is the one module that reads its frames.
"""
from __future__ import annotations

import enum


class ResumePolicy(enum.IntEnum):
    """``edgespec.v1.ResumePolicy``: what happens to the client's offline tokens on Resume."""

    KEEP = 0  # every provisional token stands; the target continues from the offline text
    ROLLBACK = 1  # drop from the first disagreement; the target's token goes there (the text is the target's)


class FeatureKind(enum.IntEnum):
    """``edgespec.v1.FeatureKind``: what the server sends back per verified token."""

    NONE = 0  # token ids only (ngram, independent)
    LAST_HIDDEN = 1  # HIDDEN (EAGLE, Beagle)
    MOA = 2  # LSA, and for TLI = N also TLI_K and TLI_V


# Feature names (``edgespec.v1.Feature.name``): the tensors a verification's answer carries.
HIDDEN = "hidden"  # [n, E]: the target's final-norm output per token
LSA = "lsa"  # [n, 2*E_kv]: MoA's Layer Self-Attention over every layer's K|V, per token
TLI_K = "tli_k"  # [N, n, E_kv]: keys of the target's last N layers (MoA with TLI = N)
TLI_V = "tli_v"  # [N, n, E_kv]: values of the same layers
FEATURE_NAMES = (HIDDEN, LSA, TLI_K, TLI_V)

# Most alternatives sent per committed token (``edgespec.v1.LogprobRequest.top``), as OpenAI's chat API allows.
MAX_TOP_LOGPROBS = 20
# Largest gRPC message either side sends or takes, unless configured otherwise (the server's Info reports its
# own): room for a long context's ids and a full tree's feature frames.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
# A draft tree's wire form (``Draft.tree``): a node's parent is one byte, and its largest value names the last
# committed token, so a tree holds at most 255 nodes. Here rather than in ``shared.tree`` (which loads torch) so
# that configs and --help can name it.
ROOT = 255  # the parent index meaning "the last committed token"
MAX_NODES = ROOT  # most nodes in a tree
NODE_BYTES = 4  # a node on the wire: its token id in three bytes, its parent in one
MAX_TOKEN_ID = (1 << 24) - 1  # the largest id three bytes hold
# Most tokens one Draft may ask the target to decode on its own (``Draft.decode_ahead``): a step's features stay
# within what a full tree's answer carries, and the session's stream is not held for long.
MAX_DECODE_AHEAD = 64
# Most elements an activation frame may claim (134M; 512 MiB as float32 while decoding) unless the reader passes
# its own bound: a 64 MiB message holds about 64M int8 elements of real activations, which zstd barely shrinks,
# so live frames fit with room to spare; a larger bound is for bigger tensors read from a trusted disk.
MAX_ELEMENTS = 1 << 27
# The session id: longer ones are refused, as an id is echoed in errors, which must stay deliverable.
MAX_SESSION_ID_CHARS = 128
# A refusal's details travel in a header (grpc-message) that the peer caps at 8 KiB after percent-encoding
# (3 bytes per non-ASCII byte); past this many UTF-8 bytes a message is cut so the refusal still arrives.
MAX_DETAILS_BYTES = 2048
ID_BYTES = 5  # a token id as a protobuf varint, at most (uint32)
# Everything in a Session message but its id lists (session id, names, fingerprint, settings, hash), with room for
# a peer's over-long string, which the server then refuses with a message that says what was wrong.
MESSAGE_SLACK_BYTES = 2 << 20


def session_message_bytes(max_context_tokens: int, max_tree_nodes: int) -> int:
    """The largest ClientMessage a session can legitimately send: a Resume, whose committed ids, provisional ids
    and reopen's prompt are each at most a context long, or an Open's prompt and tree. gRPC refuses anything
    larger (RESOURCE_EXHAUSTED) before it is parsed: a 30 MB Open would otherwise become hundreds of MB of
    Python objects before its length check refused it."""
    return 3 * ID_BYTES * max_context_tokens + NODE_BYTES * max_tree_nodes + MESSAGE_SLACK_BYTES


# Largest HTTP request body either API reads by default (413 past it, before it is read): a 32k-token context is
# a few hundred KB of text; room for long contexts.
DEFAULT_MAX_BODY_BYTES = 8 << 20

# Call metadata.
SESSION_METADATA_KEY = "x-edgespec-session"  # the session id on every Session stream, so a proxy can route it
API_KEY_METADATA_KEY = "authorization"  # "Bearer <key>", on every call to a server started with an API key
# Trailing metadata on every status the edgespec server itself ends a call with (its value: the code's name).
# A status without it came from the transport or a proxy in between: an INTERNAL "Stream removed" when a
# proxy's upstream replica dies mid-stream is a link failure to resume from, not the server's answer.
SERVER_STATUS_METADATA_KEY = "x-edgespec-status"
