"""Tokenizer fingerprint: a stable hash of what makes two tokenizers interchangeable.

A drafter made for another tokenizer produces garbage, not an error, so the
server refuses a client whose fingerprint is not its own. The hash covers the
vocabulary (token string -> id), the added/special tokens, and the special
token roles (bos, eos, pad, unk); nothing that changes with library versions
(class names, file layouts, chat templates).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hex sha256 of the tokenizer's vocabulary and special tokens."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    added = sorted((int(i), str(t)) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items())
    roles = {role: getattr(tokenizer, role, None) for role in ("bos_token", "eos_token", "pad_token", "unk_token")}
    roles = {role: None if value is None else str(value) for role, value in roles.items()}
    blob = json.dumps({"vocab": vocab, "added": added, "roles": roles}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def committed_hash(token_ids: list[int]) -> bytes:
    """sha256 of token ids as uint32 little endian (the wire's Resume.committed_hash)."""
    h = hashlib.sha256()
    for t in token_ids:
        h.update(int(t).to_bytes(4, "little"))
    return h.digest()
