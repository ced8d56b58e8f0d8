"""A conversation's second turn through one client (as `client serve` runs every request): the server restores
turn one's KV from its prefix cache, and the independent drafter keeps its own KV across generations (its
cache follows the longest common prefix of what it holds and the new committed text), so neither side
prefills the history again; the answer is still the target's greedy text."""
from __future__ import annotations

from support.greedy import greedy_continuation
from support.servers import running_server

from edgespec.client.loop.generation import GenerationConfig


def test_turn_two_reuses_the_servers_and_the_drafters_kv(tiny_model_dir, make_client, monkeypatch):
    with running_server(tiny_model_dir, max_context_tokens=512, prefix_cache_bytes=1 << 28) as server:
        client = make_client(server.address, drafter="independent")
        fed: list[int] = []  # tokens the drafter's model was fed, pass by pass
        real = client.drafter._hidden
        monkeypatch.setattr(client.drafter, "_hidden", lambda ids, *a: (fed.append(len(ids)), real(ids, *a))[1])

        turn_one = client.encode_chat([{"role": "user", "content": "def add(a, b):"}])
        first = client.generate(turn_one, GenerationConfig(max_new_tokens=20))
        # Turn two as the ids of turn one, its answer and a new question (the tiny tokenizer does not give its
        # random answers back unchanged from their text, which a real chat template would).
        history = turn_one + first.token_ids
        turn_two = history + client.encode("\nand sub?")
        hits_before = server.core.prefix_cache.stats.hits
        fed.clear()
        second = client.generate(turn_two, GenerationConfig(max_new_tokens=20))

        assert fed[0] <= len(turn_two) - len(history) + 2  # the drafter's first pass: what is new since turn one
        assert server.core.prefix_cache.stats.hits - hits_before >= len(history) - 1  # the server's Open restored
        want = greedy_continuation(server.core.target.model, turn_two, 20, client.tokens.eos_ids)
        assert second.token_ids == want
