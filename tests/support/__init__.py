"""What the tests of every area share; tests/conftest.py puts this folder on sys.path (as `support`) and
registers the fixture modules.

- servers.py: the verification server with the tiny target, with overrides (`running_server`,
  `tiny_server_config`)
- clients.py: an edgespec client with a quick link (fixture `make_client`)
- relays.py: netem's relay in front of a server, and a generation driven through a cut link
- streams.py: one Session stream to a server, message by message (over the client's own SessionStream)
- drafters.py: the learned drafters' tiny 4-layer target, its feature store and drafters trained on it by
  recipe (fixture `train_drafter`)
- cli.py: `edgespec ...` in this process (fixture `edgespec_in_process`)
- greedy.py: the target's own greedy continuation, the reference for token-exact checks (the package's cached
  greedy_continuation, a no-cache recomputed_greedy, transformers' generated_greedy)
- asgi_server.py: an ASGI app (either OpenAI API) served by uvicorn on a loopback port, for a with-block
- fuzz_decoders.py: the mutators the decoder fuzz tests draw from, and the long fuzz run
  (`python tests/support/fuzz_decoders.py --inputs 1000000`)
"""
