"""The prefix cache: KV of finished sessions and plain-API requests, kept for prompts that start the same way.
``cache``: PrefixCache (what sessions and the decoder call); ``index``: a radix tree over token ids; ``kv``:
snapshots of a session's KV (blocks shared on a paged pool, rows copied from a DynamicCache)."""
