"""The training data set: prompts with the target's own greedy responses, plus code text.

A drafter learns to predict the target, so responses must be what the target
writes: they are generated here by the target itself (greedy, chat template).
The builder appends one JSON line per finished sample to ``samples.jsonl``, so
an interrupted run resumes where it stopped. Each line:
``{"id", "kind", "split", "prompt", "response"}`` (``response`` is empty for
plain code text, whose ``prompt`` is the text itself).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from edgespec.shared.errors import EdgespecError
from .corpus import DEFAULT_TEXT_GLOBS, Conversation, read_chat_file, text_chunks, text_files
from .prompts import Sample, derive_samples, split_of
from .train_config import DataConfig, FileDataConfig

log = logging.getLogger(__name__)


def read_samples(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by an interruption: everything before it stands
    return rows


def chat_text(tokenizer, prompt: str, response: str | None) -> str:
    """The chat-formatted text of one turn; without response it ends with the generation prompt."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text if response is None else text + response + tokenizer.eos_token


def generate_batch(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy responses of the target to chat prompts (one user turn each), batched with left padding."""
    return generate_chat(model, tokenizer, [[{"role": "user", "content": p}] for p in prompts], max_new_tokens)


def build_dataset(target: str, out_dir: str | Path, config: DataConfig = DataConfig(),
                  device: str | None = None, dtype: str | None = None, capture=None) -> Path:
    """Write (or finish) ``out_dir/samples.jsonl``; returns its path. ``capture``: called once the target is
    loaded, as ``capture(target, loaded, first_row)``, it returns what answers each batch and keeps the
    answers' features (``answer_capture.capture_into``); None: the answers alone."""
    from tqdm import tqdm

    from edgespec.shared.models import load_model

    path, done = _open_samples(out_dir, target, config)
    root = Path(config.source_root) if config.source_root else None
    samples = derive_samples(config.seed, config.n_write, config.n_explain, config.n_code, config.code_chars,
                             root=root) + client_samples(config, root)
    todo = [s for s in samples if s.id not in done]
    log.info("%d samples, %d already done, %d to go -> %s", len(samples), len(done), len(todo), path)
    with path.open("a", encoding="utf-8") as f:
        for s in [s for s in todo if s.kind == "code"]:
            _append(f, s, "", config)
        batches = batched_by_length([s for s in todo if s.kind != "code"], config.batch_size, config.seed)
        if not batches:
            return path
        loaded = load_model(target, device=device, dtype=dtype)
        store = capture(target, loaded, len(done)) if capture is not None else None
        bar = tqdm(total=sum(map(len, batches)), desc="target responses", mininterval=10)
        for i, batch in enumerate(batches):
            t0 = time.perf_counter()
            answer = generate_batch if store is None else store.answer
            responses = answer(loaded.model, loaded.tokenizer, [s.prompt for s in batch], config.max_new_tokens)
            rows = [_append(f, s, r, config) for s, r in zip(batch, responses)]
            if store is not None:
                store.write(rows)
            bar.update(len(batch))
            log.info("batch %d/%d in %.0fs", i + 1, len(batches), time.perf_counter() - t0)
    return path


def client_samples(config: DataConfig, root: Path | None = None) -> list[Sample]:
    """The requests in the client's forms (client_prompts.py), interleaved by a seeded shuffle so that a run
    stopped early still holds every kind. ``root``: where the functions and module docstrings come from
    (default: the standard library and the installed packages); Debian's package list adds topics."""
    import random

    from .client_prompts import (chat_prompts, completion_prompts, docstring_topics, dpkg_topics,
                                 package_files)
    from .prompts import source_files

    rng = random.Random(config.seed + 1)
    files = source_files(root) if root is not None else package_files()
    found = completion_prompts(files, config.n_complete, rng)
    if config.n_chat:
        topics = docstring_topics(rng.sample(files, min(len(files), 4 * config.n_chat)))
        topics += [] if root is not None else dpkg_topics()
        found += chat_prompts(topics, config.n_chat, rng)
    rng.shuffle(found)
    return [Sample(pid, pid.split(":")[0], prompt) for pid, prompt in found]


def batched_by_length(samples: list[Sample], batch_size: int, seed: int = 0, window: int = 8) -> list[list[Sample]]:
    """The samples cut into batches of prompts of similar length: a left-padded prompt token costs a CPU's
    prefill as much as a real one. Each run of ``window`` batches is sorted by length, then its batches go in
    a seeded random order: the kinds differ in length (a "complete this function" request is several times a
    math question), so in sorted order a run stopped early (at 256 a batch, within its first window) would
    hold the short kinds alone. A last, short batch stays last."""
    import random

    rng, span = random.Random(seed), max(1, batch_size * window)
    batches = []
    for i in range(0, len(samples), span):
        ordered = sorted(samples[i:i + span], key=lambda s: len(s.prompt))
        run = [ordered[j:j + batch_size] for j in range(0, len(ordered), batch_size)]
        full = [b for b in run if len(b) == batch_size]
        rng.shuffle(full)
        batches += full + [b for b in run if len(b) < batch_size]
    return batches


def _append(f, sample: Sample, response: str, config: DataConfig) -> dict:
    row = {"id": sample.id, "kind": sample.kind, "split": split_of(sample.id, config.val_fraction),
           "prompt": sample.prompt, "response": response}
    _write_row(f, row)
    return row


# Settings a resume may change: how the work is batched and how many rows of each kind are asked for (a larger
# count asks for more; the rows already written are kept). Any other change (the target, the seed, the answers'
# length cap, the split, the sources) would put rows of two different data sets under one data_config.json.
RESUME_MAY_CHANGE = ("batch_size", "max_tokens", "n_write", "n_explain", "n_code", "n_complete", "n_chat")


class DataResumeError(EdgespecError, ValueError, grpc_code="FAILED_PRECONDITION"):
    """A resume whose settings would choose other rows than the data folder already holds."""


def _open_samples(out_dir: str | Path, target: str, config) -> tuple[Path, set]:
    """Record the run's settings beside ``samples.jsonl`` and make that file resumable: the ids it already
    holds (a partly written last line dropped). A resume whose settings would choose other rows is refused."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "samples.jsonl"
    rows = read_samples(path)
    settings = json.loads(json.dumps({"target": target, **asdict(config)}))  # tuples as JSON lists, to compare
    recorded = out / "data_config.json"
    if rows and recorded.is_file():
        before = json.loads(recorded.read_text(encoding="utf-8"))
        changed = sorted(k for k in set(before) | set(settings)
                         if k not in RESUME_MAY_CHANGE and before.get(k) != settings.get(k))
        if changed:
            was = ", ".join(f"{k}={before.get(k)!r}" for k in changed)
            now = ", ".join(f"{k}={settings.get(k)!r}" for k in changed)
            raise DataResumeError(f"{out} holds {len(rows)} rows made with {was}; this run asks {now}, which "
                                  f"would mix two data sets: give the same settings to resume, or another --out")
    recorded.write_text(json.dumps(settings, indent=1))
    # rewritten without a half-written last line an interruption left, so appends start on a fresh line
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, {row["id"] for row in rows}


def build_from_files(target: str, out_dir: str | Path, config: FileDataConfig, device: str | None = None,
                     dtype: str | None = None) -> Path:
    """Write (or finish) ``out_dir/samples.jsonl`` from local chat and text files.

    Text rows are ``{"kind": "text", "prompt": chunk}``; chat rows ``{"kind": "chat", "messages": [...]}``
    with ``"answers": "given"|"target"``. Rows already in the file are kept (resume)."""
    import random

    from transformers import AutoTokenizer

    from edgespec.shared.models.loading import model_location

    if config.answers not in ("given", "target"):
        raise ValueError(f"answers must be 'given' or 'target', got {config.answers!r}")
    if not config.text and not config.chats:
        raise ValueError("no data: give text files/folders (--text) or chat files (--chat)")
    path, done = _open_samples(out_dir, target, config)
    tokenizer = AutoTokenizer.from_pretrained(model_location(target))
    rng = random.Random(config.seed)
    with path.open("a", encoding="utf-8") as f:
        if config.text:
            files = text_files(list(config.text), tuple(config.text_globs) or DEFAULT_TEXT_GLOBS)
            rng.shuffle(files)
            chunks, tokens = [], 0
            for p in files:
                if config.max_tokens and tokens >= config.max_tokens:
                    break
                for cid, text in list(text_chunks(p, tokenizer, config.chunk_tokens))[:config.chunks_per_file]:
                    chunks.append((cid, text))
                    tokens += config.chunk_tokens
            # Extraction goes in file order: shuffled, an early stop still sees every kind of text; a
            # few held-out chunks first, so a store cut short can already be validated on.
            rng.shuffle(chunks)
            first = [c for c in chunks if split_of(c[0], config.val_fraction) == "val"][:config.val_first]
            chunks = first + [c for c in chunks if c not in first]
            log.info("%d text files, %d chunks (~%d tokens)", len(files), len(chunks), tokens)
            # The chunks already written count against --max-tokens: on resume the files may differ (a
            # package installed since shuffles the list), and chunks not yet seen must not add a second budget.
            room = (config.max_tokens // config.chunk_tokens - sum(i.startswith("text:") for i in done)
                    if config.max_tokens else len(chunks))
            for cid, text in chunks:
                if room <= 0:
                    break
                if cid not in done:
                    _write_row(f, {"id": cid, "kind": "text", "split": split_of(cid, config.val_fraction),
                                   "prompt": text, "response": ""})
                    room -= 1
        convs = [c for p in config.chats for c in read_chat_file(p) if c.id not in done]
        if config.answers == "given":
            for c in convs:
                _write_row(f, _chat_row(c, c.messages, "given", config))
        elif convs:
            from edgespec.shared.models import load_model

            loaded = load_model(target, device=device, dtype=dtype)
            for i in range(0, len(convs), config.batch_size):
                batch = convs[i:i + config.batch_size]
                for c, messages in zip(batch, regenerate(loaded.model, loaded.tokenizer, batch, config.max_new_tokens)):
                    _write_row(f, _chat_row(c, messages, "target", config))
                log.info("regenerated %d/%d conversations", min(i + config.batch_size, len(convs)), len(convs))
    return path


def regenerate(model, tokenizer, convs: list[Conversation], max_new_tokens: int) -> list[tuple[dict, ...]]:
    """The conversations with every assistant turn rewritten by the target (greedy), turn by turn:
    later turns see the target's own earlier answers, as they would when it serves."""
    out: list[list[dict]] = [[] for _ in convs]
    turns = [list(c.messages) for c in convs]
    for k in range(max(len(t) for t in turns)):
        need = [i for i, t in enumerate(turns) if k < len(t) and t[k]["role"] == "assistant"]
        for i, t in enumerate(turns):
            if k < len(t) and t[k]["role"] != "assistant":
                out[i].append(t[k])
        if need:
            answers = generate_chat(model, tokenizer, [out[i] for i in need], max_new_tokens)
            for i, a in zip(need, answers):
                out[i].append({"role": "assistant", "content": a})
    # A conversation that ends on a user turn gets the target's answer to it.
    last = [i for i, m in enumerate(out) if m and m[-1]["role"] == "user"]
    if last:
        for i, a in zip(last, generate_chat(model, tokenizer, [out[i] for i in last], max_new_tokens)):
            out[i].append({"role": "assistant", "content": a})
    return [tuple(m) for m in out]


@torch.inference_mode()
def generate_chat(model, tokenizer, histories: list[list[dict]], max_new_tokens: int) -> list[str]:
    """Greedy answers of the target to chat histories, batched with left padding (`batched_greedy`)."""
    from edgespec.shared.models.loading import model_eos_ids

    from .batched_greedy import chat_batch, greedy_batch

    enc = chat_batch(tokenizer, histories, model.device)
    run = greedy_batch(model, enc["input_ids"], enc["attention_mask"], max_new_tokens,
                       model_eos_ids(model, tokenizer), tokenizer.pad_token_id)
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in run.generated]


def chat_ids_and_mask(tokenizer, messages: list[dict] | tuple[dict, ...]) -> tuple[list[int], list[int]]:
    """Token ids of a chat-formatted conversation and a mask that is 1 on the assistant turns' tokens
    (their text and end-of-turn marker), found as character spans of the rendered template."""
    full = tokenizer.apply_chat_template(list(messages), tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(list(messages[:i]), tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(list(messages[:i + 1]), tokenize=False)
        if not (full.startswith(upto) and upto.startswith(before)):
            raise ValueError("the chat template does not render a conversation as a growing prefix; "
                             "cannot tell the assistant's tokens apart")
        spans.append((len(before), len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s < b for a, b in spans)) for s, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def _chat_row(c: Conversation, messages, answers: str, config: FileDataConfig) -> dict:
    return {"id": c.id, "kind": "chat", "split": split_of(c.id, config.val_fraction), "answers": answers,
            "messages": list(messages)}


def _write_row(f, row: dict) -> None:
    f.write(json.dumps(row) + "\n")
    f.flush()
