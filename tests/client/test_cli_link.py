"""`edgespec client` and `edgespec client serve` build one LinkConfig from the link flags: serve's client and its
/health probe share it, deadline settings included."""
from __future__ import annotations

import os

import pytest

from edgespec.client.cli import generation_config_from_args, link_config, local_api
from edgespec.cli import build_parser
from edgespec.shared.wire import ResumePolicy


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("EDGESPEC_") and name != "EDGESPEC_HOME":
            monkeypatch.delenv(name)


LINK_ARGV = ["--server", "h:1", "--min-deadline", "45", "--tls", "--ca", "ca.pem", "--server-api-key", "k"]


@pytest.mark.parametrize("command", [["client"], ["client", "serve"]])
def test_run_and_serve_read_the_same_link_settings(command):
    args = build_parser().parse_args([*command, *LINK_ARGV])
    link = link_config(args, args.server)
    assert (link.address, link.tls, link.root_certificates, link.api_key) == ("h:1", True, "ca.pem", "k")
    assert (link.min_deadline_s, link.max_deadline_s) == (45.0, 45.0)  # the ceiling rises to a floor above it
    default = link_config(build_parser().parse_args(command), "h:1")
    assert (default.min_deadline_s, default.max_deadline_s, default.tls) == (1.0, 30.0, False)


def test_a_runs_generation_settings():
    args = build_parser().parse_args(["client", "--max-tokens", "7", "--stop", "x", "--temperature", "0.5",
                                      "--seed", "3", "--policy", "keep", "--offline-wait", "2"])
    config = generation_config_from_args(args)
    assert (config.max_new_tokens, config.stop, config.sampling.temperature, config.seed) == (7, ("x",), 0.5, 3)
    assert (config.resume_policy, config.offline_wait_s) == (ResumePolicy.KEEP, 2.0)
    default = generation_config_from_args(build_parser().parse_args(["client"]))
    assert (default.max_new_tokens, default.stop, default.resume_policy) == (512, (), ResumePolicy.ROLLBACK)


def test_serve_loads_its_client_over_the_link_its_health_probe_uses(tiny_server, tiny_model_dir):
    args = build_parser().parse_args(["client", "serve", "--server", tiny_server.address, "--tokenizer",
                                      str(tiny_model_dir), "--drafter", "ngram", "--min-deadline", "3",
                                      "--offline-wait", "4"])
    slot, app = local_api(args)
    try:
        assert slot.wait_settled(60) and slot.status == "ok", slot.detail
        assert slot.client.config.link is slot.link and slot.link.min_deadline_s == 3.0
    finally:
        slot.close()


@pytest.mark.parametrize("command", [["client"], ["client", "serve"], ["demo"]])
def test_the_draft_vocabulary_flag(command, capsys):
    """`--draft-vocab N`: a count, or 64k (0 or full = every id); unset leaves IndependentConfig's default; a
    negative or a word is refused by name."""
    assert build_parser().parse_args([*command, "--draft-vocab", "32768"]).draft_vocab == 32768
    assert build_parser().parse_args([*command, "--draft-vocab", "0"]).draft_vocab == 0
    assert build_parser().parse_args([*command, "--draft-vocab", "64k"]).draft_vocab == 65536
    assert build_parser().parse_args([*command, "--draft-vocab", "full"]).draft_vocab == 0
    assert build_parser().parse_args(command).draft_vocab is None
    for bad in ("-1", "lots"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*command, "--draft-vocab", bad])
        assert "is not a number of ids" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["client"], ["client", "serve"], ["demo"]])
def test_the_context_vocabulary_flag_reaches_the_drafter_options(command):
    """`--context-vocab` / `--no-context-vocab` set DrafterOptions.context_vocab; unset leaves IndependentConfig's
    default (None)."""
    from edgespec.client.cli import drafter_options_from_args

    for flags, want in (([], None), (["--context-vocab"], True), (["--no-context-vocab"], False)):
        args = build_parser().parse_args([*command, "--drafter", "independent", "--draft-vocab", "65536", *flags])
        assert args.context_vocab is want
        options = drafter_options_from_args(args)
        assert (options.name, options.draft_vocab, options.context_vocab) == ("independent", 65536, want)
