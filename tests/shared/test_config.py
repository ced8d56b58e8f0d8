"""Settings layers on the real `edgespec` parser: command line > EDGESPEC_* > --config YAML > default."""
from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from edgespec.cli import build_parser
from edgespec.shared.config import LayeredParser, enable_layers


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("EDGESPEC_") and name != "EDGESPEC_HOME":
            monkeypatch.delenv(name)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def refused(*argv: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    return err.getvalue()


def test_precedence_command_line_over_environment_over_file_over_default(tmp_path, monkeypatch):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("model: from-file\nhttp-port: 7001\nmax_sessions: 3\nsession-ttl: 5\n")
    monkeypatch.setenv("EDGESPEC_HTTP_PORT", "7002")
    monkeypatch.setenv("EDGESPEC_SESSION_TTL", "6.5")
    args = parse("server", "--config", str(cfg), "--session-ttl", "7")
    assert args.model == "from-file"  # file only
    assert args.port == 7002  # environment over file, converted by the flag's type (--http-port: --port's old name)
    assert args.max_sessions == 3  # file, underscore spelling
    assert args.session_ttl == 7.0  # command line over both
    assert args.grpc_port == 50051  # nobody set it: the default
    bare = parse("server", "m")
    assert (bare.port, bare.model_positional) == (7002, "m")  # environment without a file


def test_config_file_from_the_environment_and_the_equals_spelling(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("drafter: independent\nmax-tokens: 9\n")
    monkeypatch.setenv("EDGESPEC_CONFIG", str(cfg))
    assert (parse("client").drafter, parse("client").max_tokens) == ("independent", 9)
    other = tmp_path / "d.yaml"
    other.write_text("max-tokens: 11\n")
    assert parse("client", f"--config={other}").max_tokens == 11  # the command line's file wins


def test_switches_and_repeatable_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_TRUST_REMOTE_CODE", "yes")
    monkeypatch.setenv("EDGESPEC_RANDOM_MOA_PART", "[a, b]")
    args = parse("server", "m")
    assert args.trust_remote_code is True and args.random_moa_part == ["a", "b"]
    # the command line replaces the lower layers' list instead of appending to it
    assert parse("server", "m", "--random-moa-part", "c").random_moa_part == ["c"]
    monkeypatch.setenv("EDGESPEC_TRUST_REMOTE_CODE", "0")
    assert parse("server", "m").trust_remote_code is False
    cfg = tmp_path / "s.yaml"
    cfg.write_text("moa-server-part: moa-tli0\nno-router: true\n")
    args = parse("client", "--config", str(cfg))
    assert args.moa_server_part == "moa-tli0" and args.no_router is True


def test_vllm_aliases_read_from_their_own_variables(monkeypatch):
    monkeypatch.setenv("EDGESPEC_MAX_MODEL_LEN", "4096")
    monkeypatch.setenv("EDGESPEC_SSL_CERTFILE", "/c.pem")
    args = parse("server", "m", "--ssl-keyfile", "/k.pem", "--dtype", "auto")
    assert (args.max_context, args.tls_cert, args.tls_key, args.dtype) == (4096, "/c.pem", "/k.pem", "auto")
    monkeypatch.setenv("EDGESPEC_MAX_CONTEXT", "2048")
    assert "EDGESPEC_MAX_CONTEXT='2048' and EDGESPEC_MAX_MODEL_LEN='4096'" in refused("server", "m")


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("http-prot: 1\n")
    err = refused("server", "--config", str(cfg))
    assert "unknown key 'http-prot'" in err and "did you mean 'http-port'" in err


@pytest.mark.parametrize("text, words", [
    ("port: eighty\n", ["port", "int", "eighty"]),
    ("log-format: xml\n", ["--log-format is one of text, json", "xml"]),
    ("trust-remote-code: maybe\n", ["switch", "maybe"]),
    ("- a\n- b\n", ["must be a mapping"]),
    ("port: [1, 2]\n", ["takes one value"]),
    ("config: other.yaml\n", ["cannot name another"]),
    ("port: {\n", ["not valid YAML"]),
])
def test_bad_values_in_the_file_are_refused_with_the_reason(tmp_path, text, words):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    err = refused("server", "m", "--config", str(cfg))
    assert all(w in err for w in words), err


def test_bad_environment_value_and_missing_file_are_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESPEC_PORT", "x")
    assert "EDGESPEC_PORT" in refused("client")
    monkeypatch.delenv("EDGESPEC_PORT")
    assert "cannot read the config file" in refused("server", "m", "--config", str(tmp_path / "none.yaml"))


def test_an_abbreviated_config_flag_is_not_silently_ignored(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 1\n")
    assert "write --config in full" in refused("server", "m", "--conf", str(cfg))


def test_edgespec_home_is_never_a_flag(monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", "/somewhere")
    parser = LayeredParser(prog="x")
    parser.add_argument("--home")
    with pytest.raises(ValueError, match="EDGESPEC_HOME"):
        enable_layers(parser)


def test_flags_added_later_are_covered(monkeypatch):
    """Generic over the parser: a flag another module adds after enable_layers reads its variable too."""
    parser = LayeredParser(prog="x")
    enable_layers(parser)
    parser.add_argument("--admission-timeout", type=float, default=1.0)
    monkeypatch.setenv("EDGESPEC_ADMISSION_TIMEOUT", "2.5")
    assert parser.parse_args([]).admission_timeout == 2.5


def test_required_flags_can_come_from_a_lower_layer(monkeypatch):
    parser = LayeredParser(prog="x")
    parser.add_argument("--name", required=True)
    enable_layers(parser)
    monkeypatch.setenv("EDGESPEC_NAME", "n")
    assert parser.parse_args([]).name == "n"
    monkeypatch.delenv("EDGESPEC_NAME")
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        parser.parse_args([])


def test_environment_is_read_at_parse_time_and_defaults_show_in_help(monkeypatch):
    parser = build_parser()  # built before the variable exists
    monkeypatch.setenv("EDGESPEC_HTTP_PORT", "9123")
    monkeypatch.setenv("EDGESPEC_API_KEY", "s3cret")
    assert parser.parse_args(["server", "m"]).port == 9123
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args(["server", "--help"])
    text = " ".join(out.getvalue().split())
    assert "(default: 9123)" in text and "(default: 50051)" in text
    assert "s3cret" not in text and "(default: set, hidden)" in text
    assert "command line > environment > config file > default" in text


def test_other_commands_ignore_edgespec_variables(monkeypatch):
    """Only server and client are layered: EDGESPEC_PROFILE (the relay's) does not become bench's --profile."""
    monkeypatch.setenv("EDGESPEC_PROFILE", "satellite")
    monkeypatch.setenv("EDGESPEC_LIMIT", "not-a-number")
    parse("models", "list")


def test_default_ports_differ():
    assert parse("server", "m").port == 8080
    assert parse("client", "serve").port == 8000


def test_switches_are_not_secrets_in_help(monkeypatch):
    """The hiding rule matches options that take a value (keys), not switches such as --metrics-need-key."""
    monkeypatch.setenv("EDGESPEC_METRICS_NEED_KEY", "1")
    monkeypatch.setenv("EDGESPEC_SERVER_API_KEY", "s3cret")
    for command in ("server", "client"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(out.getvalue().split())
        need_key = text[text.rindex("--metrics-need-key"):][:120]  # its help entry, not the usage line
        assert "hidden" not in need_key and "(default: True)" in need_key, need_key
        assert "s3cret" not in text
        if command == "server":
            assert "None" not in text[text.rindex("--device"):][:80]


def test_a_misspelt_variable_is_reported_with_the_name_it_looks_like(monkeypatch):
    monkeypatch.setenv("EDGESPEC_MAX_SESIONS", "3")
    monkeypatch.setenv("EDGESPEC_HOME", "/tmp/models")  # known: the model cache
    monkeypatch.setenv("EDGESPEC_CONFIG_UNUSED_X", "1")
    args = build_parser().parse_args(["server", "m"])
    warnings = " | ".join(args.config_warnings)
    assert "EDGESPEC_MAX_SESIONS" in warnings and "did you mean EDGESPEC_MAX_SESSIONS" in warnings
    assert "EDGESPEC_CONFIG_UNUSED_X" in warnings
    assert "EDGESPEC_HOME" not in warnings.replace("EDGESPEC_HOME?", "")
    # A variable of the other command is known: one environment serves both.
    monkeypatch.delenv("EDGESPEC_MAX_SESIONS")
    monkeypatch.delenv("EDGESPEC_CONFIG_UNUSED_X")
    monkeypatch.setenv("EDGESPEC_DRAFTER", "ngram")
    monkeypatch.setenv("EDGESPEC_CLIENT_PORT", "8000")  # the deploy entrypoint's own
    assert build_parser().parse_args(["server", "m"]).config_warnings == []


def test_help_names_each_default_once():
    parser = LayeredParser(prog="p")
    parser.add_argument("--tokens", type=int, default=128, help="most new tokens (default 128)")
    parser.add_argument("--port", type=int, default=50051, help="port")
    parser.add_argument("--model", default=None, help="model (default: the registry's)")
    parser.add_argument("--quiet", action="store_true", help="say less")
    text = " ".join(parser.format_help().split())
    assert "most new tokens (default 128) --port" in text and "port (default: 50051)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
    parser.set_defaults(tokens=64)  # what a layer below the command line does: the help's own figure is stale
    assert "most new tokens (default 128) (default: 64)" in " ".join(parser.format_help().split())


def test_client_serve_keys_mean_what_vllms_mean(monkeypatch):
    """--api-key guards the local API (vLLM's meaning); the server's key is --server-api-key."""
    args = parse("client", "serve", "--api-key", "l0cal", "--server-api-key", "rem0te")
    assert (args.api_key, args.server_api_key) == ("l0cal", "rem0te")
    assert parse("client", "serve", "--local-api-key", "old").api_key == "old"  # the old name still works
    monkeypatch.setenv("EDGESPEC_SERVER_API_KEY", "from-env")
    monkeypatch.setenv("EDGESPEC_LOCAL_API_KEY", "l0cal-env")
    args = parse("client", "serve")
    assert (args.api_key, args.server_api_key) == ("l0cal-env", "from-env")
