"""The experiments of `edgespec bench`: speed, link, disconnect, codec, specbench (specbench.py).

Each one starts its own server process (and relays), runs a prompt set, and
appends one JSON line per generation to OUT/<experiment>.jsonl. Baselines are
measured in the same run on the same prompts:
- plain API: the server generates alone (its OpenAI-compatible streaming
  endpoint, KV cache, no drafting) over the same link;
- local only: the small model alone on the client, no server.

The server and the client run on disjoint cores, as two machines would (``cpus.py``): by default,
on a machine of 2 cores or more, the server on the upper half and the client (with the relays) on
the lower half; every record's environment says where each ran.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal

from edgespec.shared.models.registry import DEFAULT_DRAFTER, DEFAULT_TARGET
from edgespec.netem.cpus import NOT_PINNED, CpuSplit, choose_split, pinned
from .activation_codec import measure_all, real_prompts
from .loopback import relayed
from .prompt_sets import Prompt, load_prompts
from .records import JsonLines, environment, read_records
from .remote import RELAY_PROFILE, RemoteServer
from .server_process import ServerProcess
from .specbench import questions_of, run_specbench, write_answer_files
from .systems import ProgressBar, drafter_client, plain_api

EXPERIMENTS = ("speed", "link", "disconnect", "codec", "specbench")
REMOTE_EXPERIMENTS = ("link", "disconnect", "specbench")  # those that measure a server started elsewhere


@dataclass
class BenchConfig:
    experiment: str  # one of EXPERIMENTS
    out: Path  # folder for <experiment>.jsonl, report.md and plots
    model: str = DEFAULT_TARGET  # the server's target
    drafter_model: str = DEFAULT_DRAFTER  # the small model: `independent` drafter and the local-only baseline
    drafters: tuple[str, ...] = ("ngram", "independent")  # drafters compared
    profiles: tuple[str, ...] = ("5g", "4g")  # network profiles of `link`
    prompt_sets: tuple[str, ...] = ("humaneval", "mtbench")  # `disconnect` always uses humaneval
    limit: int = 20  # prompts per set
    set_limits: dict = field(default_factory=dict)  # per-set overrides of limit, e.g. {"humaneval": 40}
    max_new_tokens: int = 256  # per generation
    cut_after: tuple[int | None, ...] = (1, 10, 25, 50, None)  # `disconnect`: B new tokens, None = never
    cut_mode: Literal["blackhole", "reset"] = "blackhole"  # `disconnect`: packets vanish, or connections close

    # `disconnect`: generation ends after the answer's first code block, for every system alike (the
    # instruct models add prose after it that HumanEval never reads; it would only cost time)
    humaneval_stop: tuple[str, ...] = ("\n```\n",)
    server_threads: int | None = None  # torch threads of the server process (None: one per server core
    # when pinned, else torch's default)
    server_cpus: str | None = None  # the server's cores as a CPU list ("1", "2-3"); None: see pin
    client_cpus: str | None = None  # the client's (and the relays') cores; None: see pin
    pin: bool = True  # with neither list given: server on the upper half of the cores, client on the
    # lower half (on >= 2 cores); False: both share every core
    questions: str = ""  # `specbench`: a question file in Spec-Bench's format ("": the shipped 480 questions)
    per_category: int | None = None  # `specbench`: the first N questions of each category (None: all)
    categories: tuple[str, ...] = ()  # `specbench`: only these categories (mt_bench: MT-Bench's eight; (): all 13)
    server_args: tuple[str, ...] = ()  # extra `edgespec server` flags
    server_dtype: str = ""  # the server's weights and activations (`edgespec server --dtype`; "": its default, bf16
    # where the CPU computes it natively): float32 measures a CPU without native bf16 on one that has it
    server: str = ""  # HOST:PORT (gRPC) of a server started elsewhere to measure ("": start one here); the
    # link is then the real network as tc shaped it (remote.py), recorded in every line
    server_http: str = ""  # that server's HTTP side, for the plain API ("": the same host, port 8080)
    seed: int = 0  # relay randomness
    progress: bool = True  # a progress bar
    command: str = ""  # the command line that started the run (goes into every record and the report)


def run(config: BenchConfig) -> Path:
    """Run one experiment; returns the JSON-lines file it wrote."""
    if config.experiment not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {config.experiment!r}; choose one of {', '.join(EXPERIMENTS)}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    if config.experiment == "codec":  # no server, no client: nothing to pin
        sink = JsonLines(config.out / f"{config.experiment}.jsonl", environment(settings))
        _codec(config, sink)
        return sink.path
    if config.experiment == "specbench":  # a wrong file or category fails here, before a server starts
        questions_of(config)
    remote = None
    if config.server:
        if config.experiment not in REMOTE_EXPERIMENTS:
            raise ValueError(f"--server: `{config.experiment}` runs against a server it starts; "
                             f"{', '.join(REMOTE_EXPERIMENTS)} measure one started elsewhere")
        if config.server_cpus or config.client_cpus:
            raise ValueError("--server: the server runs elsewhere, so --server-cpus/--client-cpus do not apply")
        remote = RemoteServer.connect(config.server, config.server_http)
        print(f"server: {remote.grpc_address} (plain API http://{remote.http_address}), serving "
              f"{remote.model or 'an unnamed model'}; link: {remote.link.profile}"
              f"{' on ' + remote.link.device if remote.link.device else ''}", flush=True)
    split = NOT_PINNED if remote else choose_split(config.server_cpus, config.client_cpus, config.pin)
    env = environment(settings, split.to_dict())
    if remote:
        env["server"] = remote.to_dict()
    sink = JsonLines(config.out / f"{config.experiment}.jsonl", env)
    print(f"cpus: {split.describe()}", flush=True)
    with pinned(split.client):
        _serve_and_run(config, split, sink, remote)
    if config.experiment == "specbench":
        write_answer_files(config.out, read_records(config.out, "specbench"))
    return sink.path


def links(config: BenchConfig, server) -> list[tuple[str, str]]:
    """(the profile a record names, the local relay's profile) per link a run measures: each --profiles
    through an emulating relay, or, against a remote server, the network tc shaped behind an ideal relay."""
    if isinstance(server, RemoteServer):
        return [(server.link.profile, RELAY_PROFILE)]
    return [(p, p) for p in config.profiles]


def _serve_and_run(config: BenchConfig, split: CpuSplit, sink: JsonLines, remote: RemoteServer | None = None) -> None:
    """Start the server (on its cores), or take the remote one, and run the experiment's generations against it."""
    # A run that stopped half way goes on where it stopped (`--fresh` starts over); an archived folder's
    # gzipped records count as done too.
    sink.done = {_key(r) for r in read_records(config.out, config.experiment)}
    sets = {"disconnect": ("humaneval",), "specbench": ()}.get(config.experiment, config.prompt_sets)
    prompts = [p for name in sets for p in load_prompts(name, config.set_limits.get(name, config.limit))]
    if remote:
        _run_against(config, remote, prompts, sink)
        return
    log = start_server_log(config.out / f"{config.experiment}-server.log", len(sink.done), config.command)
    # MoA drafters (shipped names such as moa-tli0, also as moa-tli0+ngram) need their server part on the server
    from edgespec.client import split_lookup

    names = {split_lookup(d.partition("@")[0].partition(":")[0])[0] for d in config.drafters}
    moa_parts = [a for d in sorted(names) if d.startswith("moa") for a in ("--moa-server-part", d)]
    threads = config.server_threads or (len(split.server) if split.server else None)
    # No prefix cache: the systems answer each prompt one after another, so with it every system after the
    # first (the plain API) would find the prompt's KV cached and skip its prefill, and the speed-ups would
    # count the saved prefill. (Before this, Spec-Bench's long-prompt categories and the link runs did.)
    no_cache = ["--prefix-cache-gb", "0"]
    dtype = ("--dtype", config.server_dtype) if config.server_dtype else ()
    with ServerProcess(config.model, [*no_cache, *config.server_args, *dtype, *moa_parts], threads, log_path=log,
                       cpus=split.server) as server:
        _run_against(config, server, prompts, sink)


def _run_against(config: BenchConfig, server, prompts: list[Prompt], sink: JsonLines) -> None:
    if config.experiment == "specbench":
        run_specbench(config, server, sink, links(config, server))
        return
    {"speed": _speed, "link": _link, "disconnect": _disconnect}[config.experiment](config, server, prompts, sink)


def start_server_log(log: Path, done: int, command: str) -> Path:
    """The server's log for a run: emptied for a run from the start; for a run that goes on where an earlier
    one stopped (`done` generations already written), kept, with a line that says where the new part begins
    (the server appends, and the two servers' lines would read as one)."""
    if not done:
        log.unlink(missing_ok=True)
    else:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"--- resumed {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} with {done} generations "
                    f"done: {command}\n")
    return log


def _generate(client, prompt: Prompt, config: BenchConfig, on_token: Callable[[int], None] | None = None,
              stop: tuple[str, ...] = (), offline_wait_s: float = 30.0):
    """One generation through the client; on_token(n) after the n-th output token."""
    from edgespec.client import GenerationConfig, RetractEvent, TokenEvent

    ids = client.encode_chat(prompt.messages())
    gen = client.generation(ids, GenerationConfig(max_new_tokens=config.max_new_tokens, stop=stop,
                                                  offline_wait_s=offline_wait_s))
    count = 0
    for event in gen:
        if isinstance(event, TokenEvent):
            count += 1
            if on_token:
                on_token(count)
        elif isinstance(event, RetractEvent):
            count -= event.count
    return gen.result


def _record(prompt: Prompt, **fields) -> dict:
    return {"set": prompt.set_name, "prompt_id": prompt.id, **fields}


def _key(record: dict) -> tuple:
    """What identifies one generation of an experiment (a resumed run skips the ones it has)."""
    return (record.get("set"), record.get("prompt_id"), record.get("profile"), record.get("system"),
            record.get("cut_after"))


def _done(sink: JsonLines, prompt: Prompt, profile: str, system: str, cut_after=None) -> bool:
    return _key(_record(prompt, profile=profile, system=system, cut_after=cut_after)) in sink.done


def _local_only(model, tokenizer, prompt_ids: list[int], config: BenchConfig) -> dict:
    """The small model alone (greedy, KV cache), as the client would run it offline."""
    import torch

    eos = [i for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")} if i is not None]
    ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=config.max_new_tokens,
                             do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    wall = time.perf_counter() - start
    new = out[0, len(prompt_ids):].tolist()
    return {"new_tokens": len(new), "wall_s": wall, "tokens_per_s": len(new) / wall if wall else 0.0,
            "calls": 0, "text": tokenizer.decode(new, skip_special_tokens=True)}


def _speed(config: BenchConfig, server: ServerProcess, prompts: list[Prompt], sink: JsonLines) -> None:
    bar = ProgressBar(len(prompts) * (len(config.drafters) + 1), config.progress, "speed")
    clients = {d: drafter_client(server.grpc_address, d, config) for d in config.drafters}
    for prompt in prompts:
        ids = clients[config.drafters[0]].encode_chat(prompt.messages()) if clients else []
        plain = plain_api(server.http_address, ids, config)
        sink.write(_record(prompt, experiment="speed", profile="ideal", system="plain-api", **plain))
        bar.step("plain-api")
        for name, client in clients.items():
            result = _generate(client, prompt, config)
            sink.write(_record(prompt, experiment="speed", profile="ideal", system=name,
                               finish_reason=result.finish_reason, text=client.decode(result.token_ids),
                               **result.metrics.to_dict()))
            bar.step(name)
    for client in clients.values():
        client.close()
    bar.close()


def _link(config: BenchConfig, server: ServerProcess, prompts: list[Prompt], sink: JsonLines) -> None:
    from edgespec.shared.models.loading import load_model

    small = load_model(config.drafter_model, device="cpu")
    per_profile = len(config.drafters) + 1
    measured = links(config, server)
    bar = ProgressBar(len(prompts) * (len(measured) * per_profile + 1), config.progress, "link")
    for prompt in prompts:  # local-only needs no link: once per prompt
        if not _done(sink, prompt, "none", "local-only"):
            ids = _chat_ids(small.tokenizer, prompt)
            sink.write(_record(prompt, experiment="link", profile="none", system="local-only",
                               **_local_only(small.model, small.tokenizer, ids, config)))
        bar.step("local-only")
    for profile, relay_profile in measured:
        with relayed(server.grpc_address, relay_profile, config.seed) as (grpc_addr, grpc_relay), \
                relayed(server.http_address, relay_profile, config.seed + 1) as (http_addr, http_relay):
            clients = {d: drafter_client(grpc_addr, d, config, tokenizer=small.tokenizer) for d in config.drafters}
            for prompt in prompts:
                if not _done(sink, prompt, profile, "plain-api"):
                    plain = plain_api(http_addr, _chat_ids(small.tokenizer, prompt), config, relay=http_relay)
                    sink.write(_record(prompt, experiment="link", profile=profile, system="plain-api", **plain))
                bar.step(f"{profile} plain-api")
                for name, client in clients.items():
                    if not _done(sink, prompt, profile, name):
                        result = _generate(client, prompt, config)
                        m = result.metrics
                        sink.write(_record(prompt, experiment="link", profile=profile, system=name,
                                           finish_reason=result.finish_reason, round_trips_s=m.round_trips_s,
                                           text=client.decode(result.token_ids), **m.to_dict()))
                    bar.step(f"{profile} {name}")
            for client in clients.values():
                client.close()
    bar.close()


def _chat_ids(tokenizer, prompt: Prompt) -> list[int]:
    from edgespec.client import chat_prompt_ids

    return chat_prompt_ids(tokenizer, prompt.messages())


def _disconnect(config: BenchConfig, server: ServerProcess, prompts: list[Prompt], sink: JsonLines) -> None:
    from edgespec.client import load_tokenizer
    from .sandbox import score_response

    stop = tuple(config.humaneval_stop)
    # Prompt by prompt (every B and the target's own answer), so a run stopped half way has whole rows.
    cuts = sorted(config.cut_after, key=lambda c: float("-inf") if c is None else -c)  # never, 50, 25, ...
    bar = ProgressBar(len(prompts) * (len(config.drafters) * len(cuts) + 1), config.progress, "disconnect")
    # The cut is made by a relay on this side; locally it shapes nothing ("ideal"), against a remote server the
    # records name the network tc shaped.
    profile, relay_profile = links(config, server)[0] if isinstance(server, RemoteServer) else ("ideal", "ideal")
    drafters: dict = {}  # one drafter (the small model loaded once) per name, shared by its generations
    tokenizer = None
    for prompt in prompts:
        if not _done(sink, prompt, profile, "target", None):
            # The reference: the target's own greedy answer (its streaming endpoint, no drafting, no cut).
            tokenizer = tokenizer or load_tokenizer(config.drafter_model)
            plain = plain_api(server.http_address, _chat_ids(tokenizer, prompt), config, stop)
            passed = score_response(prompt.problem, plain["text"]).passed
            sink.write(_record(prompt, experiment="disconnect", profile=profile, system="target", cut_after=None,
                               cut_mode=None, passed=passed, passed_stop_at_cut=passed, **plain))
        bar.step("target")
        for drafter in config.drafters:
            for cut in cuts:
                if not _done(sink, prompt, profile, drafter, cut):
                    # A relay of its own per generation: the cut is final for that generation only.
                    with relayed(server.grpc_address, relay_profile, config.seed) as (address, relay), \
                            drafter_client(address, drafter, config, tokenizer=tokenizer,
                                           instance=drafters.get(drafter)) as client:
                        drafters[drafter], tokenizer = client.drafter, client.tokenizer

                        def on_token(n: int) -> None:
                            if cut is not None and n == cut and relay.state == "up":
                                relay.cut(config.cut_mode)

                        # The cut is final: no waiting for a link that will not come back (a drafter that
                        # cannot go on alone ends at the cut; one that can finishes the answer offline).
                        result = _generate(client, prompt, config, on_token, stop, offline_wait_s=0.0)
                    text = client.decode(result.token_ids)
                    passed = score_response(prompt.problem, text).passed
                    # The lower bound: what the user would have had if generation stopped at the cut.
                    at_cut = client.decode(result.token_ids[:cut]) if cut is not None else text
                    passed_at_cut = score_response(prompt.problem, at_cut).passed
                    sink.write(_record(prompt, experiment="disconnect", profile=profile, system=drafter,
                                       cut_after=cut, cut_mode=config.cut_mode, passed=passed,
                                       passed_stop_at_cut=passed_at_cut, finish_reason=result.finish_reason,
                                       text=text, **result.metrics.to_dict()))
                bar.step(f"{drafter} B={cut}")
    bar.close()


def _codec(config: BenchConfig, sink: JsonLines) -> None:
    from edgespec.shared.models.loading import load_model

    loaded = load_model(config.model)
    for row in measure_all(loaded.model, real_prompts(loaded.tokenizer, 400)):
        sink.write({"experiment": "codec", **asdict(row)})
