"""shared.auth: where a key is read from, and that a wrong one is told apart from a missing one."""
from __future__ import annotations

from edgespec.shared.auth import api_key_matches, api_key_problem, api_keys_from_headers


def test_the_bearer_scheme_is_read_in_any_case_and_x_api_key_too():
    for headers in ({"authorization": "Bearer k"}, {"authorization": "bearer k"}, {"authorization": "BEARER   k "},
                    {"x-api-key": "k"}, {"authorization": "Basic zzz", "x-api-key": "k"}):
        assert api_keys_from_headers(headers) == ["k"], headers
    for headers in ({}, {"authorization": "Bearer "}, {"authorization": "k"}, {"x-api-key": "  "}):
        assert api_keys_from_headers(headers) == [], headers


def test_keys_match_exactly():
    assert api_key_matches("s3cret", "s3cret")
    assert not api_key_matches("s3cre", "s3cret") and not api_key_matches(None, "s3cret")
    assert not api_key_matches("s3cret\ud800", "s3cret")  # odd text is compared, not a crash


def test_the_problem_says_missing_or_wrong():
    assert api_key_problem({}, None) is None
    assert "needs an API key" in api_key_problem({}, "k")
    assert "not this server's" in api_key_problem({"x-api-key": "j"}, "k")
    assert api_key_problem({"authorization": "bearer k"}, "k") is None


def test_a_wrong_key_in_either_header_is_refused_even_beside_the_right_one():
    for headers in ({"authorization": "Bearer k", "x-api-key": "wrong"},
                    {"authorization": "Bearer wrong", "x-api-key": "k"}):
        assert "not this server's" in api_key_problem(headers, "k"), headers
    assert api_key_problem({"authorization": "Bearer k", "x-api-key": "k"}, "k") is None
