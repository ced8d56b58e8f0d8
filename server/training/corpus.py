"""Training data from the files people keep: chat logs and plain text, read into conversations.

Formats (one file may hold either JSON or JSON lines):

- ShareGPT: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}``
- OpenAI-style chat: ``{"messages": [{"role": "user"|"assistant"|"system", "content": ...}, ...]}``
- plain text or code: any other file matched by the globs, cut into chunks of about
  ``chunk_tokens`` target tokens (all of a chunk is learned; no chat template).

Test sets never become training data: a path or a text that names HumanEval, MT-Bench or
Spec-Bench is skipped (``is_test_set``), whatever the user points at.
"""
from __future__ import annotations

import fnmatch
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Lower-case spellings of the evaluation sets this project reports on (netem/README.md's results).
TEST_SET_NAMES = ("human_eval", "humaneval", "human-eval", "mt_bench", "mtbench", "mt-bench",
                  "spec_bench", "specbench", "spec-bench", "fastchat", "ifbench", "if_bench", "if-bench")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}
DEFAULT_TEXT_GLOBS = ("*.py", "*.md", "*.rst", "*.txt", "*.c", "*.h", "*.js", "*.ts", "*.rs", "*.go",
                      "*.java", "*.sh", "README*", "*.md.gz", "*.txt.gz")


class CorpusError(ValueError):
    """A data file that cannot be read as the format it claims."""


@dataclass(frozen=True)
class Conversation:
    id: str  # stable: file path + record number
    messages: tuple[dict, ...]  # {"role": "system"|"user"|"assistant", "content": str}, in order


def is_test_set(text: str) -> bool:
    low = text.lower()
    return any(name in low for name in TEST_SET_NAMES)


def normalise_messages(record: dict, where: str) -> tuple[dict, ...]:
    """ShareGPT or OpenAI-style record -> messages with role/content; a clear error otherwise."""
    if "conversations" in record:
        out = []
        for i, turn in enumerate(record["conversations"]):
            if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
                raise CorpusError(f"{where}: conversations[{i}] needs 'from' and 'value' (ShareGPT), got {turn!r:.80}")
            role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                raise CorpusError(f"{where}: conversations[{i}] has an unknown speaker {turn['from']!r} "
                                  f"(known: {', '.join(sorted(_SHAREGPT_ROLES))})")
            out.append({"role": role, "content": str(turn["value"])})
        return tuple(out)
    if "messages" in record:
        out = []
        for i, m in enumerate(record["messages"]):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or "content" not in m:
                raise CorpusError(f"{where}: messages[{i}] needs role system|user|assistant and content, "
                                  f"got {m!r:.80}")
            out.append({"role": m["role"], "content": str(m["content"])})
        return tuple(out)
    raise CorpusError(f"{where}: a chat record needs 'conversations' (ShareGPT) or 'messages' (OpenAI style); "
                      f"it has {sorted(record)[:6]}")


def read_chat_file(path: str | Path) -> Iterator[Conversation]:
    """Conversations of a ShareGPT / messages file (a JSON list, one JSON object, or JSON lines)."""
    path = Path(path)
    if is_test_set(str(path)):
        return
    text = _read_text(path)
    if text is None:
        raise CorpusError(f"{path}: not UTF-8 text")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}: not valid JSON ({e})") from None
    else:
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise CorpusError(f"{path}:{n}: not a JSON line ({e})") from None
    for n, record in enumerate(records):
        if not isinstance(record, dict):
            raise CorpusError(f"{path}: record {n} is a {type(record).__name__}, not an object")
        messages = normalise_messages(record, f"{path} record {n}")
        if not any(m["role"] == "assistant" for m in messages) and not any(m["role"] == "user" for m in messages):
            continue
        if any(is_test_set(m["content"]) for m in messages):
            continue
        yield Conversation(f"chat:{path}:{record.get('id', n)}", messages)


def text_files(roots: list[str | Path], globs: tuple[str, ...] = DEFAULT_TEXT_GLOBS,
               max_bytes: int = 2_000_000) -> list[Path]:
    """Sorted files under the roots whose name matches a glob; no test sets, caches or hidden folders."""
    out = []
    for root in map(Path, roots):
        if not root.exists():
            raise CorpusError(f"{root}: no such file or folder")
        walk = [(str(root.parent), [], [root.name])] if root.is_file() else os.walk(root)
        for folder, dirs, files in walk:
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(files):
                p = Path(folder) / name
                if not any(fnmatch.fnmatch(name, g) for g in globs) or is_test_set(str(p)):
                    continue
                try:
                    if p.is_file() and 0 < p.stat().st_size <= max_bytes:
                        out.append(p)
                except OSError:
                    continue
    return sorted(set(out))


def _read_text(path: Path) -> str | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    return None if "\x00" in text else text


def text_chunks(path: Path, tokenizer, chunk_tokens: int, min_tokens: int = 64) -> Iterator[tuple[str, str]]:
    """(id, text) chunks of about chunk_tokens target tokens of one text file."""
    text = _read_text(path)
    if not text or is_test_set(text):
        return
    ids = tokenizer.encode(text, add_special_tokens=False)
    for start in range(0, len(ids), chunk_tokens):
        piece = ids[start:start + chunk_tokens]
        if len(piece) >= min(min_tokens, chunk_tokens):  # a short last piece is dropped
            yield f"text:{path}:{start}", tokenizer.decode(piece)
