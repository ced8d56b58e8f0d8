"""Client + real server over loopback gRPC with tiny models: the output is the target's own greedy output."""
from __future__ import annotations

import pytest

from edgespec.client.drafters.tree_builder import TreeShape
from edgespec.client.loop.generation import GenerationConfig, TokenEvent, TokenOrigin

PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "hello hello hello world, hello hello", "x"]


@pytest.mark.parametrize("drafter", ["ngram", "independent"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_target(tiny_server, make_client, tiny_target_f32, greedy, drafter, prompt):
    client = make_client(tiny_server.address, drafter)
    ids = client.encode(prompt)
    result = client.generate(ids, GenerationConfig(max_new_tokens=48))
    assert result.token_ids == greedy(tiny_target_f32, ids, 48, client.tokens.eos_ids)
    m = result.metrics
    # one call per verified tree, plus the prefill when Open carried no tree (nothing drafted from the prompt)
    assert m.calls in (m.num_verifications, m.num_verifications + 1)
    assert m.new_tokens == len(result.token_ids)
    assert m.offline_tokens == 0 and m.disconnects == 0
    assert m.bytes_up > 0 and m.bytes_down > 0


def test_target_as_drafter_accepts_deep_trees(tiny_server, make_client, tiny_model_dir, tiny_target_f32, greedy):
    """With the target's own weights as drafter, trees are accepted: tau well above 1, output unchanged."""
    client = make_client(tiny_server.address, "independent", drafter_dir=tiny_model_dir,
                         tree=TreeShape(branch=2, depth=5, max_nodes=12, min_prob=0.0))
    ids = client.encode(PROMPTS[0])
    result = client.generate(ids, GenerationConfig(max_new_tokens=60, ignore_eos=True))
    assert result.token_ids == greedy(tiny_target_f32, ids, 60, set())
    assert result.metrics.acceptance_length > 3.0
    assert TokenOrigin.ACCEPTED in result.origins
    # tau counts the bonus: committed tokens per verification (the first token came from Open)
    m = result.metrics
    assert m.num_accepted_tokens + m.num_verifications + 1 >= m.new_tokens


@pytest.mark.parametrize("draft_on_open", [True, False])
def test_open_carries_a_tree_verified_with_the_prefill(tiny_server, make_client, tiny_model_dir, tiny_target_f32,
                                                      greedy, draft_on_open):
    """The drafter drafts from the prompt; the server verifies that tree in the prefill's forward pass."""
    client = make_client(tiny_server.address, "independent", drafter_dir=tiny_model_dir,
                         tree=TreeShape(branch=2, depth=5, max_nodes=12, min_prob=0.0))
    ids = client.encode(PROMPTS[1])
    result = client.generate(ids, GenerationConfig(max_new_tokens=30, ignore_eos=True, draft_on_open=draft_on_open))
    assert result.token_ids == greedy(tiny_target_f32, ids, 30, set())
    m = result.metrics
    if draft_on_open:  # no separate prefill call; the first tokens are accepted drafts
        assert m.calls == m.num_verifications
        assert result.origins[0] is TokenOrigin.ACCEPTED
    else:
        assert m.calls == m.num_verifications + 1
        assert result.origins[0] is TokenOrigin.BONUS


def test_events_stream_every_token_once_with_origin(tiny_server, make_client, tiny_model_dir):
    client = make_client(tiny_server.address, "independent", drafter_dir=tiny_model_dir)
    gen = client.generation(client.encode(PROMPTS[1]), GenerationConfig(max_new_tokens=30, ignore_eos=True))
    events = [e for e in gen if isinstance(e, TokenEvent)]
    assert [e.index for e in events] == list(range(30))
    assert [e.token for e in events] == gen.result.token_ids
    assert [e.origin for e in events] == gen.result.origins
    assert TokenOrigin.BONUS in gen.result.origins and TokenOrigin.ACCEPTED in gen.result.origins
    assert gen.result.finish_reason == "length"


def test_stop_string_ends_output(tiny_server, make_client, tiny_target_f32, greedy):
    client = make_client(tiny_server.address, "ngram")
    ids = client.encode(PROMPTS[0])
    reference = greedy(tiny_target_f32, ids, 40, set())
    text = client.decode(reference)
    stop = text[10:12]
    result = client.generate(ids, GenerationConfig(max_new_tokens=40, stop=(stop,), ignore_eos=True))
    assert result.finish_reason == "stop"
    got = client.decode(result.token_ids)
    assert stop in got and stop not in client.decode(result.token_ids[:-1])
    assert result.token_ids == reference[: len(result.token_ids)]


def test_max_tokens_is_exact(tiny_server, make_client, tiny_model_dir):
    client = make_client(tiny_server.address, "independent", drafter_dir=tiny_model_dir)
    for n in (1, 2, 7):
        result = client.generate(client.encode("abc"), GenerationConfig(max_new_tokens=n, ignore_eos=True))
        assert len(result.token_ids) == n and result.finish_reason == "length"


def test_wrong_tokenizer_is_refused(tiny_server, tmp_path):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig
    from edgespec.shared.errors import TokenizerMismatchError
    from edgespec.shared.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.add_tokens(["<extra>"])
    with pytest.raises(TokenizerMismatchError, match="--tokenizer"):
        EdgespecClient(ClientConfig(LinkConfig(tiny_server.address), DrafterOptions("ngram")), tokenizer=tok)


def test_unreachable_server_says_where(tmp_path):
    import socket

    from edgespec.client.link.grpc_transport import LinkConfig, LinkDownError, connect

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(LinkDownError, match=f"127.0.0.1:{port}"):
        connect(LinkConfig(f"127.0.0.1:{port}", connect_timeout_s=0.3))
