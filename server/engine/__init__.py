"""The engine: how the target runs forwards for many sessions' KV (a batch of ``Work``, one ``ForwardOutput``
each). ``base``: the interface; ``generic``: a DynamicCache per session, any architecture; ``batched``: one KV
pool and one forward for all sessions, with its parts beside it (``kv``, ``masks``, ``rows``, ``step``,
``accept``, ``graphs``, ``attention``, ``fusion``, ``memory``, ``timing``); ``choice``: which one a server runs.
Nothing is imported here: import the module that defines a name (or the server's face, ``edgespec.server``)."""
