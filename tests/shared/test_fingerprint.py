from __future__ import annotations

import hashlib

from edgespec.shared.fingerprint import committed_hash, tokenizer_fingerprint
from edgespec.shared.models.tiny import tiny_tokenizer


def test_fingerprint_is_stable_and_sensitive():
    a, b = tiny_tokenizer(), tiny_tokenizer()
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    assert len(tokenizer_fingerprint(a)) == 64
    b.add_tokens(["<|extra|>"])
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(b)
    c = tiny_tokenizer()
    c.eos_token = "<|endoftext|>"  # same vocabulary, another end-of-sequence role
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(c)


def test_fingerprint_survives_save_and_load(tmp_path):
    from transformers import AutoTokenizer

    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path)
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(tmp_path)) == tokenizer_fingerprint(tok)


def test_committed_hash():
    assert committed_hash([1, 2]) == hashlib.sha256(b"\x01\x00\x00\x00\x02\x00\x00\x00").digest()
    assert committed_hash([1, 2]) != committed_hash([2, 1])
