"""The OpenAI-compatible HTTP layer that both edgespec APIs share.

The server's plain API (the target generating alone, the baseline) and the
client's local API (``edgespec client serve``, generating speculatively) are
one FastAPI app shape over two backends, so a request means the same thing on
both and is refused the same way:

- ``requests``: the request bodies, parsed and validated (what is supported,
  what is refused with a 400 naming the field);
- ``errors``: OpenAI error objects and the handlers that make every failure one;
- ``gate``: the API key (checked before anything else) and the body size limit;
- ``prompts``: prompt text or ids, the chat template, the context check;
- ``backend``: what each side provides (its tokenizer and a way to generate);
- ``generate``: one choice's token stream -> text, stop strings, logprobs, usage;
- ``responses``: response and chunk bodies; ``sse``: server-sent events;
- ``routes``: the /v1 endpoints, mounted by both apps.
"""
