"""What an experiment runs a prompt through (the edgespec client of a drafter's name, or the server's own
streaming API) and the progress bar over its generations; experiments.py and specbench.py share them."""
from __future__ import annotations

import argparse
import time

from tqdm import tqdm

from edgespec.client import vocab_count
from .records import sse_chunks
from .tree_sweep import parse_shape


class ProgressBar:
    """Generations done, as a tqdm bar (off when not enabled)."""

    def __init__(self, total: int, enabled: bool, desc: str):
        self.bar = tqdm(total=total, disable=not enabled, desc=desc, unit="gen")

    def step(self, label: str) -> None:
        self.bar.set_postfix_str(label)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def drafter_client(address: str, drafter: str, config, tokenizer=None, instance=None):
    """A client of `drafter` for the experiment's BenchConfig `config`; `instance`: an already loaded drafter of
    that name to reuse."""
    from edgespec.client import ClientConfig, DrafterOptions, EdgespecClient, LinkConfig

    from .loop_modes import loop_mode

    drafter, loop = loop_mode(drafter)  # "independent@serial": the serial loop (loop_modes.LOOP_MODES)
    options = DrafterOptions(**drafter_shape(drafter), model=config.drafter_model, target=config.model)
    return EdgespecClient(ClientConfig(LinkConfig(address), options, tokenizer=config.drafter_model, loop=loop),
                          tokenizer=tokenizer, drafter=instance)


def drafter_shape(drafter: str) -> dict:
    """ "independent+int8~64k:2x6x8@0.1" -> the drafter's DrafterOptions fields: its name (with "+ngram" when one of
    the "+" parts is ngram: prompt lookup merged in), its weights after "+"
    (IndependentConfig.weights: int4-mlp, int8 or float), its draft vocabulary after "~" (a count, "64k" or
    "full", then "+ctx" or "+noctx" for IndependentConfig.context_vocab) and its EAGLE-2 tree shape after ":"
    (BxDxM[@min_prob], as tree-sweep's --shapes), so weights, vocabularies, fixed shapes and --tree auto compare
    in one run; a name alone keeps the defaults."""
    from edgespec.client import WEIGHTS

    named, _, shape = drafter.partition(":")
    named, tilde, vocab = named.partition("~")
    name, *extras = named.split("+")
    lookup = "ngram" in extras  # NAME+ngram: prompt lookup merged into its trees (client/drafters/with_lookup.py)
    extras = [e for e in extras if e != "ngram"]
    if len(extras) > 1 or (extras and extras[0] not in WEIGHTS):
        raise argparse.ArgumentTypeError(f"unknown weights {'+'.join(extras)!r} in {drafter!r}; choose one of "
                                         f"{', '.join(WEIGHTS)} (and +ngram for prompt lookup merged in)")
    weights = extras[0] if extras else None
    out = {"name": name + ("+ngram" if lookup else ""), **({"weights": weights} if weights else {}),
           **({"tree": parse_shape(shape)} if shape else {})}
    if tilde:
        vocab, plus, context = vocab.partition("+")
        if plus and context not in ("ctx", "noctx"):
            raise argparse.ArgumentTypeError(f"unknown draft vocabulary option {context!r} in {drafter!r}: only "
                                             "+ctx (the committed text's ids as well) or +noctx (the list alone)")
        out["draft_vocab"] = vocab_size_arg(vocab, drafter)
        if plus:  # either way, whatever the default is, so a run names what it compares
            out["context_vocab"] = context == "ctx"
    return out


def vocab_size_arg(text: str, where: str) -> int:
    """ "65536", "64k" -> 65536; "full" or "0" -> 0 (the whole vocabulary): --draft-vocab's parser, with the
    system's name in the error."""
    try:
        return vocab_count(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"draft vocabulary {text!r} in {where!r} is not a count, 64k or full") from None


def plain_api(http_address: str, prompt_ids: list[int], config, stop: tuple[str, ...] = (), relay=None) -> dict:
    """The server's own streaming completion endpoint (greedy, `config.max_new_tokens`): tokens, wall time, text;
    with `relay` (the RelayThread in front of `http_address`) also the bytes that crossed it."""
    before = relay.stats() if relay else None
    body = {"prompt": prompt_ids, "max_tokens": config.max_new_tokens, "temperature": 0, "stream": True}
    if stop:
        body["stop"] = list(stop)
    text, usage = [], {}
    start = time.perf_counter()
    first = None
    for chunk in sse_chunks(f"http://{http_address}/v1/completions", body, timeout=600):
        if first is None:
            first = time.perf_counter() - start
        text.append(chunk["choices"][0]["text"])
        usage = chunk.get("usage") or usage
    wall = time.perf_counter() - start
    tokens = usage.get("completion_tokens", 0)
    out = {"new_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0,
           "first_token_s": first, "calls": 1, "text": "".join(text)}
    if relay:
        after = relay.stats()
        out.update(bytes_up=after.bytes_up - before.bytes_up, bytes_down=after.bytes_down - before.bytes_down)
    return out
