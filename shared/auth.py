"""API keys: where a caller's key is read from, and how it is compared.

One helper for every door that asks for a key: the server's gRPC calls, its
HTTP API, and the client's local HTTP API. A key is read from
``Authorization: Bearer KEY`` (the scheme in any case, as RFC 7235 allows) or
from ``x-api-key: KEY``, and compared in constant time so a wrong key's
timing says nothing about the right one. A caller that sends both must send
the right key in both: a wrong one is refused, whichever header holds it (a
proxy in front that reads the other header must not see a key that passed).
"""
from __future__ import annotations

import hmac
from typing import Mapping

HOW_TO_SEND = "send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')"


def api_keys_from_headers(headers: Mapping[str, str]) -> list[str]:
    """Every key a caller sent: the bearer credentials and x-api-key, each when present."""
    keys = []
    scheme, _, credentials = (headers.get("authorization") or "").strip().partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        keys.append(credentials.strip())
    key = (headers.get("x-api-key") or "").strip()
    if key:
        keys.append(key)
    return keys


def api_key_matches(given: str | None, expected: str) -> bool:
    """True when the given key is the expected one (constant time in the key's content)."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def api_key_problem(headers: Mapping[str, str], expected: str | None) -> str | None:
    """None when the request may pass (no key needed, or the right one sent); else what is wrong, for a person."""
    if not expected:
        return None
    given = api_keys_from_headers(headers)
    if not given:
        return f"this server needs an API key: {HOW_TO_SEND}"
    if not all([api_key_matches(key, expected) for key in given]):  # a list: every key is compared, in full
        return "the API key sent is not this server's"
    return None
