"""One set of defaults (edgespec.shared.defaults), read back from every surface: `edgespec client`, `client serve`,
`edgespec.Client`, both HTTP APIs (over real HTTP), `edgespec demo`, `edgespec server` and the deploy files; and
help texts written for users (no Python repr, `client serve --help` with only what serve reads)."""
from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import httpx
import pytest
import yaml

from edgespec.shared import defaults

REPO = Path(__file__).resolve().parents[2]
LINK = {"min_deadline_s": 0.3, "connect_timeout_s": 0.5}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):  # the parsers' own defaults, not this machine's settings
        if name.startswith("EDGESPEC_") and name != "EDGESPEC_HOME":
            monkeypatch.delenv(name)


def parser_of(*words: str) -> argparse.ArgumentParser:
    from edgespec.cli import build_parser

    parser = build_parser()
    for word in words:
        parser = parser._subparsers._group_actions[0].choices[word]
    parser.format_help()  # options added on first use are there now
    return parser


def option_defaults(parser: argparse.ArgumentParser) -> dict[str, object]:
    out = {a.dest: a.default for a in parser._actions}
    out.update(parser._defaults)  # set_defaults wins, as when parsing
    return out


def test_the_defaults_are_what_the_readme_says():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("\n## Defaults\n"):readme.index("\n## Results\n")]
    assert f"`{defaults.DRAFTER}`" in table and f"| {defaults.MAX_TOKENS} |" in table
    assert f"temperature {defaults.TEMPERATURE:g}" in table and "fresh seed" in table
    assert f"`{defaults.DEMO_PROFILE}`" in table and f"gRPC {defaults.GRPC_PORT}" in table
    assert f"HTTP {defaults.HTTP_PORT}" in table and f"`client serve` {defaults.CLIENT_PORT}" in table
    assert defaults.API_KEY_ENV in table and defaults.SERVER_API_KEY_ENV in table


def test_edgespec_client_and_client_serve():
    from edgespec.client.cli import serve_parser

    run = option_defaults(parser_of("client"))
    assert (run["drafter"], run["server"], run["port"]) == (defaults.DRAFTER, defaults.SERVER, defaults.CLIENT_PORT)
    assert (run["max_tokens"], run["temperature"], run["seed"]) == (defaults.MAX_TOKENS, defaults.TEMPERATURE,
                                                                     defaults.SEED)
    serve = option_defaults(serve_parser())
    assert (serve["drafter"], serve["server"], serve["port"]) == (defaults.DRAFTER, defaults.SERVER,
                                                                  defaults.CLIENT_PORT)


def test_a_prompt_without_a_seed_gets_a_fresh_one_and_a_given_seed_is_kept():
    from edgespec.client.cli import generation_config_from_args

    args = parser_of("client").parse_args(["--prompt", "hi"])
    seeds = {generation_config_from_args(args).seed for _ in range(4)}
    assert len(seeds) == 4 and all(0 <= s < defaults.SEED_MODULUS for s in seeds)
    config = generation_config_from_args(parser_of("client").parse_args(["--seed", "7"]))
    assert config.seed == 7 and config.sampling.temperature == defaults.TEMPERATURE
    assert config.max_new_tokens == defaults.MAX_TOKENS


def test_edgespec_demo():
    demo = option_defaults(parser_of("demo"))
    assert (demo["drafter"], demo["max_tokens"], demo["temperature"], demo["seed"], demo["profile"]) == (
        defaults.DRAFTER, defaults.MAX_TOKENS, defaults.TEMPERATURE, defaults.SEED, defaults.DEMO_PROFILE)


def test_edgespec_server():
    from edgespec.server.server_config import ServerConfig

    server = option_defaults(parser_of("server"))
    assert (server["dtype"], server["port"], server["grpc_port"]) == (defaults.DTYPE, defaults.HTTP_PORT,
                                                                      defaults.GRPC_PORT)
    assert ServerConfig(model="m").dtype == defaults.DTYPE


def test_the_python_client():
    import edgespec

    init = inspect.signature(edgespec.Client.__init__).parameters
    assert (init["server"].default, init["drafter"].default, init["max_tokens"].default) == (
        defaults.SERVER, defaults.DRAFTER, defaults.MAX_TOKENS)
    assert inspect.signature(edgespec.AsyncClient.__init__).parameters["drafter"].default == defaults.DRAFTER
    sampling = inspect.signature(edgespec.Client._config).parameters
    assert (sampling["temperature"].default, sampling["top_p"].default, sampling["top_k"].default,
            sampling["seed"].default) == (defaults.TEMPERATURE, defaults.TOP_P, defaults.TOP_K, defaults.SEED)


def test_the_deploy_files():
    entrypoint = (REPO / "deploy/bin/edgespec-entrypoint").read_text()
    assert f': "${{EDGESPEC_PROFILE:={defaults.DEMO_PROFILE}}}"' in entrypoint
    assert f': "${{EDGESPEC_DRAFTER:={defaults.DRAFTER}}}"' in entrypoint
    assert f': "${{EDGESPEC_CLIENT_PORT:={defaults.CLIENT_PORT}}}"' in entrypoint
    assert f': "${{EDGESPEC_GRPC_PORT:={defaults.GRPC_PORT}}}"' in entrypoint
    assert f': "${{EDGESPEC_HTTP_PORT:={defaults.HTTP_PORT}}}"' in entrypoint
    services = yaml.safe_load((REPO / "deploy/compose/compose.yaml").read_text())["services"]
    assert services["relay"]["environment"]["EDGESPEC_PROFILE"] == f"${{EDGESPEC_PROFILE:-{defaults.DEMO_PROFILE}}}"
    assert services["client"]["environment"]["EDGESPEC_DRAFTER"] == f"${{EDGESPEC_DRAFTER:-{defaults.DRAFTER}}}"


@pytest.fixture(scope="module")
def http_server(tiny_model_dir):
    from support.servers import running_server

    with running_server(tiny_model_dir, http_port=0) as handle:
        yield handle


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_the_http_apis_default_max_tokens_and_draw_a_fresh_seed(http_server, endpoint):
    """Over real HTTP: a request without max_tokens gets the default; without a seed, a fresh one each time."""
    url = f"http://127.0.0.1:{http_server.http_port}/v1/{endpoint}"
    body = ({"prompt": "def add(a, b):"} if endpoint == "completions"
            else {"messages": [{"role": "user", "content": "add two numbers"}]})
    reply = httpx.post(url, json={**body, "ignore_eos": True}, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == defaults.MAX_TOKENS

    def text(**extra):
        answer = httpx.post(url, json={**body, "max_tokens": 24, "ignore_eos": True, **extra}, timeout=60).json()
        choice = answer["choices"][0]
        return choice["text"] if endpoint == "completions" else choice["message"]["content"]

    assert text() != text()  # temperature 1 and a fresh seed: two draws of a random model differ
    assert text(seed=11) == text(seed=11)


def test_the_python_client_draws_a_fresh_seed_unless_given_one(http_server, tiny_model_dir):
    from edgespec.client import Client

    with Client(http_server.address, "ngram", tokenizer=str(tiny_model_dir), **LINK) as client:
        draws = [client.complete("def add(a, b):", max_tokens=24) for _ in range(2)]
        assert draws[0] != draws[1]  # it was the same text on every call when the seed defaulted to 0
        assert client.complete("def add(a, b):", max_tokens=24, seed=5) == \
            client.complete("def add(a, b):", max_tokens=24, seed=5)


def test_the_python_client_takes_the_servers_key_by_its_cli_name(tiny_model_dir):
    from edgespec.client import Client

    with pytest.raises(TypeError, match="server_api_key"):
        Client("127.0.0.1:1", "ngram", tokenizer=str(tiny_model_dir), server_api_key="a", api_key="b", **LINK)


def test_client_serve_help_lists_only_what_serve_reads(capsys):
    from edgespec.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["client", "serve", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: edgespec client serve")
    for flag in ("--server", "--drafter", "--port", "--api-key", "--server-api-key", "--policy", "--max-body-mb"):
        assert flag in text
    for flag in ("--prompt", "--max-tokens", "--temperature", "--seed", "--stop", "--raw", "--json", "--color"):
        assert flag not in text, flag
    main_help = parser_of("client").format_help()
    assert "--prompt" in main_help and "--temperature" in main_help


def test_client_serve_refuses_what_only_a_prompt_run_reads(capsys):
    from edgespec.cli import main

    assert main(["client", "serve", "--server", "127.0.0.1:1", "--max-tokens", "5", "--temperature=0"]) == 2
    err = capsys.readouterr().err
    assert "--max-tokens, --temperature" in err and "client serve" in err


def all_parsers(parser: argparse.ArgumentParser, name: str = "edgespec"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield from all_parsers(sub, f"{name} {word}")


REPR = re.compile(r"\[\]|\(\)|\('|\[\'|\bNone\b|\bTrue\b|\bFalse\b|<class|\b[A-Z]\w*(Config|Shape)\b")


def test_the_repr_pattern_catches_what_help_texts_showed():
    for shown in ("(default: [])", "(default: ('5g', '4g'))", "(default: IndependentConfig's)", "(None: TreeShape's)",
                  "default: LoopConfig's, 8"):
        assert REPR.search(shown), shown
    assert not REPR.search("(default: 5g,4g) unset: no cross-origin calls; none: direct")


def test_no_python_repr_in_any_help():
    from edgespec.cli import build_parser
    from edgespec.client.cli import serve_parser

    found = []
    for name, parser in [*all_parsers(build_parser()), ("edgespec client serve", serve_parser())]:
        for line in parser.format_help().splitlines():
            if REPR.search(line):
                found.append(f"{name}: {line.strip()}")
    assert not found, "\n".join(found)


def test_a_list_default_reads_as_typed():
    from edgespec.shared.config import shown_default

    assert shown_default([]) is None and shown_default(()) is None
    assert shown_default(("5g", "4g")) == "5g,4g" and shown_default((1, 10, None)) == "1,10,never"
    assert shown_default(600.0) == "600" and shown_default(0.2) == "0.2"


def test_the_defaults_the_client_help_names_are_the_classes_own():
    """--help names the tree shape's, the draft vocabulary's and the loop's defaults in words; they are the
    defaults of the classes that apply them when the flag is unset."""
    from edgespec.client.drafters.independent import IndependentConfig
    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.client.loop.planner import LoopConfig

    helps = {a.dest: a.help for a in parser_of("client")._actions}
    shape = TreeShape()
    for dest, value in (("tree_branch", shape.branch), ("tree_depth", shape.depth), ("tree_nodes", shape.max_nodes),
                        ("tree_min_prob", shape.min_prob), ("decode_ahead", LoopConfig.decode_ahead)):
        assert f"default: {value:g})" in helps[dest], dest
    assert IndependentConfig.draft_vocab == 64 * 1024 and "default: 64k)" in helps["draft_vocab"]
    assert IndependentConfig.context_vocab is True and "default: on)" in helps["context_vocab"]
