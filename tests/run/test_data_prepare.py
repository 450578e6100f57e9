"""``plait data prepare`` with real tokenizers and real input formats: a BPE trained here with the
``tokenizers`` library, .jsonl / .json / .parquet / directory inputs, worker-count invariance,
the validation split, and the errors. Expected token streams are computed with the tokenizer
library directly, never through plait. No torch here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bpe_corpus import DOCS, EOS, expected_stream, train_bpe

from plait.cli import main
from plait.run.data import documents
from plait.run.data.documents import find_files, plan_units, read_documents
from plait.run.data.prepare import prepare
from plait.run.data.tokens import TokenFile, open_tokens
from one_line import error_of  # tests/support

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("bpe"), [EOS])


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- BPE + JSON lines
def test_jsonl_with_a_bpe_tokenizer(tmp_path, bpe):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"id": i, "text": d} for i, d in enumerate(DOCS)])
    summary = prepare([corpus], tmp_path / "t.tok", tokenizer=str(bpe))
    tf = TokenFile(tmp_path / "t.tok")
    want = expected_stream(bpe, DOCS)
    assert tf.tokens.tolist() == want
    vocab = tokenizers.Tokenizer.from_file(str(bpe)).get_vocab_size(with_added_tokens=True)
    assert tf.vocab_size == summary["vocab_size"] == vocab and tf.dtype == np.uint16
    assert summary["eos_id"] == 0 and summary["n_documents"] == len(DOCS) and summary["n_files"] == 1
    assert tf.tokenizer == summary["tokenizer"] == f"hf:{bpe.parent.name}"[-24:]
    assert summary["n_bytes_text"] == sum(len(d.encode("utf-8")) for d in DOCS)
    assert tf.tokens.tolist().count(0) == len(DOCS)  # one EOS per document
    # a directory holding tokenizer.json names the same tokenizer
    prepare([corpus], tmp_path / "d.tok", tokenizer=str(bpe.parent))
    assert (tmp_path / "d.tok").read_bytes() == (tmp_path / "t.tok").read_bytes()
    # plait train --data checks the file's vocab against the model's
    assert "vocab" in error_of(open_tokens, tmp_path / "t.tok", vocab - 1, model_name="small")
    assert open_tokens(tmp_path / "t.tok", 512, seq_len=16).n_tokens == len(want)


def test_special_token_text_inside_a_document_stays_text(tmp_path, bpe):
    docs = [f"before {EOS} after", "second"]
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    prepare([corpus], tmp_path / "t.tok", tokenizer=str(bpe))
    tokens = TokenFile(tmp_path / "t.tok").tokens.tolist()
    assert tokens.count(0) == 2 and tokens[-1] == 0  # only the EOS ids prepare put after each document
    tok = tokenizers.Tokenizer.from_file(str(bpe))
    assert tok.decode(tokens, skip_special_tokens=True) == "".join(docs)


def test_eos_from_tokenizer_config_or_flag(tmp_path):
    folder = tmp_path / "tok"
    tokenizer_file = train_bpe(folder, ["<pad>", "<s>", "</s>"])
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}}))
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS[:4]])
    summary = prepare([corpus], tmp_path / "t.tok", tokenizer=str(folder))
    assert summary["eos_id"] == 2
    assert TokenFile(tmp_path / "t.tok").tokens.tolist() == expected_stream(tokenizer_file, DOCS[:4], "</s>")
    # no end-of-text token anywhere: --eos-id is asked for, then used
    bare = train_bpe(tmp_path / "bare", ["<pad>"])
    assert "--eos-id" in error_of(prepare, [corpus], tmp_path / "b.tok", tokenizer=str(bare))
    summary = prepare([corpus], tmp_path / "b.tok", tokenizer=str(bare), eos_id=0)
    assert summary["eos_id"] == 0 and TokenFile(tmp_path / "b.tok").tokens.tolist().count(0) == 4
    # an EOS id past the tokenizer's vocab widens the file's vocab to hold it
    assert prepare([corpus], tmp_path / "w.tok", tokenizer=str(bare), eos_id=70000)["dtype"] == "uint32"
    assert TokenFile(tmp_path / "w.tok").vocab_size == 70001


# ----------------------------------------------------------------------------------- JSON inputs
def test_json_files_list_object_and_lines(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps([{"text": "alpha"}, {"text": None}, {"text": ""}, {"text": "beta"}]))
    (tmp_path / "one.json").write_text(json.dumps({"text": "gamma", "meta": 1}))
    (tmp_path / "lines.json").write_text('{"text": "delta"}\n{"text": "epsilon"}\n')  # JSON lines named .json
    summary = prepare([tmp_path / "list.json", tmp_path / "one.json", tmp_path / "lines.json"], tmp_path / "t.tok")
    tf = TokenFile(tmp_path / "t.tok")
    assert bytes(tf.tokens[tf.tokens != 256].astype(np.uint8)).decode() == "alphabetagammadeltaepsilon"
    assert summary["n_documents"] == 5 and tf.tokens.tolist().count(256) == 5  # null and "" are skipped


def test_a_record_without_the_text_key_is_an_error_not_json_syntax(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"text": "fine"}, {"content": "x", "id": 3}])
    message = error_of(prepare, [tmp_path / "c.jsonl"], tmp_path / "t.tok")
    assert "c.jsonl line 2" in message and "'text'" in message and "content, id" in message
    assert "--text-key" in message and not (tmp_path / "t.tok").exists()
    assert "c.jsonl line 1: no key 'content' (its keys: text)" in error_of(prepare, [tmp_path / "c.jsonl"],
                                                                             tmp_path / "t.tok", text_key="content")
    (tmp_path / "o.json").write_text(json.dumps({"title": "t", "body": "b"}))
    assert "no key 'text' (its keys: title, body)" in error_of(prepare, [tmp_path / "o.json"], tmp_path / "t.tok")
    (tmp_path / "n.json").write_text(json.dumps([1, 2]))
    assert "item 0" in error_of(prepare, [tmp_path / "n.json"], tmp_path / "t.tok")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    assert "bad.jsonl line 2 is not a JSON object" in error_of(prepare, [tmp_path / "bad.jsonl"], tmp_path / "t.tok")
    (tmp_path / "bad.json").write_text('[{"text": "ok"},')
    assert "not valid JSON" in error_of(prepare, [tmp_path / "bad.json"], tmp_path / "t.tok")
    write_jsonl(tmp_path / "num.jsonl", [{"text": 5}])
    assert "holds a JSON int" in error_of(prepare, [tmp_path / "num.jsonl"], tmp_path / "t.tok")


def test_text_key_selects_the_field(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"content": "one", "text": "no"}, {"content": "two", "text": "no"}])
    prepare([tmp_path / "c.jsonl"], tmp_path / "t.tok", text_key="content")
    tokens = TokenFile(tmp_path / "t.tok").tokens
    assert bytes(tokens[tokens != 256].astype(np.uint8)) == b"onetwo"


# -------------------------------------------------------------------------------- parquet inputs
def test_parquet_matches_the_same_documents_as_jsonl(tmp_path, bpe):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"id": list(range(len(DOCS))), "text": DOCS})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=4)  # 4 row groups: 4 units
    assert len(plan_units([tmp_path / "c.parquet"], "text")) == 4
    prepare([tmp_path / "c.parquet"], tmp_path / "p.tok", tokenizer=str(bpe))
    assert TokenFile(tmp_path / "p.tok").tokens.tolist() == expected_stream(bpe, DOCS)
    message = error_of(prepare, [tmp_path / "c.parquet"], tmp_path / "x.tok", text_key="body")
    assert "no column 'body'" in message and "id, text" in message
    assert "holds int64, not text" in error_of(prepare, [tmp_path / "c.parquet"], tmp_path / "x.tok", text_key="id")
    nulls = pa.table({"text": ["a", None, "b"]})
    pq.write_table(nulls, tmp_path / "n.parquet")
    assert prepare([tmp_path / "n.parquet"], tmp_path / "n.tok")["n_documents"] == 2


# ------------------------------------------------------------ directories, order, worker counts
def mixed_corpus(root: Path) -> Path:
    """A directory of every kind, nested: 15 documents in all, in the sorted order of their files."""
    (root / "b" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text(DOCS[0])
    write_jsonl(root / "b" / "c.jsonl", [{"text": d} for d in DOCS[1:9]])
    (root / "b" / "deep" / "d.json").write_text(json.dumps([{"text": d} for d in DOCS[9:12]]))
    (root / "b" / "notes.md").write_text("not an input kind: skipped")
    (root / "e.txt").write_text("")
    write_jsonl(root / "f.jsonl", [{"text": d} for d in DOCS[12:]])
    return root


def test_directories_are_read_recursively_in_sorted_order(tmp_path, bpe):
    root = mixed_corpus(tmp_path / "corpus")
    assert [p.relative_to(root).as_posix() for p in find_files([root])] == [
        "a.txt", "b/c.jsonl", "b/deep/d.json", "e.txt", "f.jsonl"]
    summary = prepare([root], tmp_path / "t.tok", tokenizer=str(bpe))
    assert TokenFile(tmp_path / "t.tok").tokens.tolist() == expected_stream(bpe, DOCS)
    assert summary["n_files"] == 4 and summary["n_documents"] == len(DOCS)  # e.txt is empty


def test_jsonl_parts_cover_every_line_once(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS])
    for unit_bytes in (1, 40, 100, 10**9):
        units = plan_units([corpus], "text", unit_bytes=unit_bytes)
        assert units[0].start == 0 and units[-1].stop == corpus.stat().st_size
        assert all(a.stop == b.start for a, b in zip(units, units[1:]))
        assert [d for u in units for d in read_documents(u, "text")] == DOCS
    assert len(plan_units([corpus], "text", unit_bytes=1)) == len(DOCS)  # one line per part at most
    write_jsonl(tmp_path / "bad.jsonl", [{"text": d} for d in DOCS[:5]] + [{"txt": "x"}])
    units = plan_units([tmp_path / "bad.jsonl"], "text", unit_bytes=100)
    assert units[-1].start > 0  # an error in a later part names its byte offset
    message = error_of(lambda: [read_documents(u, "text") for u in units])
    offset = (tmp_path / "bad.jsonl").read_bytes().index(b'{"txt"')
    assert f"the line at byte {offset}" in message


def test_output_is_the_same_for_any_worker_count(tmp_path, bpe, monkeypatch):
    root = mixed_corpus(tmp_path / "corpus")
    monkeypatch.setattr(documents, "UNIT_BYTES", 120)  # several parts per JSON-lines file
    assert len(plan_units(find_files([root]), "text")) > 6
    one = prepare([root], tmp_path / "one.tok", tokenizer=str(bpe), workers=1)
    three = prepare([root], tmp_path / "three.tok", tokenizer=str(bpe), workers=3)
    assert (tmp_path / "one.tok").read_bytes() == (tmp_path / "three.tok").read_bytes()
    assert {k: v for k, v in one.items() if k != "path"} == {k: v for k, v in three.items() if k != "path"}
    assert TokenFile(tmp_path / "three.tok").tokens.tolist() == expected_stream(bpe, DOCS)
    # an error inside a worker reaches the caller as the same one-line PlaitError
    write_jsonl(root / "g.jsonl", [{"body": "x"}])
    assert "g.jsonl line 1: no key 'text'" in error_of(prepare, [root], tmp_path / "e.tok", tokenizer=str(bpe),
                                                       workers=2)
    assert not (tmp_path / "e.tok").exists()


# ------------------------------------------------------------------------------ validation split
def test_validation_split_takes_evenly_spread_documents(tmp_path):
    docs = [f"doc{i:02d}" for i in range(10)]
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    summary = prepare([corpus], tmp_path / "train.tok", val_fraction=0.3, val_out=str(tmp_path / "val.tok"))

    def texts(path):  # the documents of a byte-tokenized file, split at the EOS ids (256)
        return "".join(chr(t) if t != 256 else "|" for t in TokenFile(path).tokens.tolist()).split("|")[:-1]

    # document i goes to validation when floor((i+1)*0.3) > floor(i*0.3): i = 3, 6, 9
    assert texts(tmp_path / "val.tok") == ["doc03", "doc06", "doc09"]
    assert texts(tmp_path / "train.tok") == [d for i, d in enumerate(docs) if i not in (3, 6, 9)]
    assert summary["val"]["n_documents"] == 3 and summary["n_documents"] == 7
    assert summary["val"]["n_tokens"] == 3 * 6 and summary["n_tokens"] == 7 * 6
    assert TokenFile(tmp_path / "val.tok").vocab_size == TokenFile(tmp_path / "train.tok").vocab_size
    # the split is worker-invariant too (it is decided in the writing process, by document index)
    prepare([corpus], tmp_path / "t2.tok", val_fraction=0.3, val_out=str(tmp_path / "v2.tok"), workers=2)
    assert (tmp_path / "v2.tok").read_bytes() == (tmp_path / "val.tok").read_bytes()


def test_validation_split_errors(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS[:3]])
    out, val = tmp_path / "t.tok", str(tmp_path / "v.tok")
    assert "raise --val-fraction" in error_of(prepare, [corpus], out, val_fraction=0.2, val_out=val)
    assert "--val-out" in error_of(prepare, [corpus], out, val_fraction=0.2)
    assert "--val-fraction" in error_of(prepare, [corpus], out, val_out=val)
    assert "[0, 1)" in error_of(prepare, [corpus], out, val_fraction=1.0, val_out=val)
    assert "output file itself" in error_of(prepare, [corpus], out, val_fraction=0.5, val_out=str(out))
    assert "workers" in error_of(prepare, [corpus], out, workers=0)
    assert not out.exists() and not Path(val).exists()


# ------------------------------------------------------------------------------ tokenizer errors
def test_tokenizer_errors(tmp_path, monkeypatch):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}])
    out = tmp_path / "t.tok"
    message = error_of(prepare, [corpus], out, tokenizer=str(tmp_path / "nope.json"))
    assert "unknown tokenizer" in message and "tiktoken:" in message and "tokenizer.json" in message
    (tmp_path / "empty").mkdir()
    assert "has no tokenizer.json" in error_of(prepare, [corpus], out, tokenizer=str(tmp_path / "empty"))
    (tmp_path / "bad.json").write_text("{}")
    assert "not a tokenizer.json" in error_of(prepare, [corpus], out, tokenizer=str(tmp_path / "bad.json"))
    monkeypatch.setitem(__import__("sys").modules, "tiktoken", None)  # as if not installed
    message = error_of(prepare, [corpus], out, tokenizer="tiktoken:gpt2")
    assert "pip install tiktoken" in message and ".[data]" not in message  # the data extra lacks tiktoken
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)
    message = error_of(prepare, [corpus], out, tokenizer=str(tmp_path / "bad.json"))
    assert "pip install tokenizers" in message and "'.[data]'" in message


def test_the_data_extra_is_what_the_messages_say():
    """A missing package's message names ``.[data]`` only for the packages pyproject's data extra installs."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    from plait.run.data.tokenizer_libs import DATA_EXTRA
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]["data"]
    installed = {requirement.split(">")[0].split("=")[0].split("<")[0].strip() for requirement in extra}
    assert installed == set(DATA_EXTRA)
    assert "tiktoken" not in installed


def test_tiktoken_encodings_through_the_library_interface(tmp_path, monkeypatch):
    """tiktoken needs its encoding files (a download); a stand-in module checks how plait calls it."""
    import sys
    import types

    class Encoding:
        n_vocab, eot_token = 1000, 999

        def encode_ordinary_batch(self, texts, num_threads):
            return [[ord(c) % 900 for c in t] for t in texts]

    fake = types.SimpleNamespace(get_encoding=lambda name: Encoding() if name == "fake" else
                                 (_ for _ in ()).throw(ValueError(name)), list_encoding_names=lambda: ["fake"])
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "ab"}, {"text": "c"}])
    summary = prepare([corpus], tmp_path / "t.tok", tokenizer="tiktoken:fake")
    assert TokenFile(tmp_path / "t.tok").tokens.tolist() == [97, 98, 999, 99, 999]
    assert summary["tokenizer"] == "tiktoken:fake" and summary["vocab_size"] == 1000
    assert "known: fake" in error_of(prepare, [corpus], tmp_path / "t.tok", tokenizer="tiktoken:other")


# ------------------------------------------------------------------------------------------- CLI
def test_cli_prepare_with_a_tokenizer_and_a_split(tmp_path, bpe, capsys):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS])
    code = main(["data", "prepare", str(corpus), "--tokenizer", str(bpe), "--out", str(tmp_path / "t.tok"),
                 "--val-fraction", "0.2", "--val-out", str(tmp_path / "v.tok"), "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "from 12 documents in 1 files" in out and "3 documents" in out and "end-of-text id 0" in out
    stream = expected_stream(bpe, DOCS)
    assert TokenFile(tmp_path / "t.tok").n_tokens + TokenFile(tmp_path / "v.tok").n_tokens == len(stream)
    code = main(["data", "prepare", str(corpus), "--out", str(tmp_path / "x.tok"), "--vocab", "5"])
    assert code == 2 and "--import-bin" in capsys.readouterr().err
    code = main(["data", "prepare", str(corpus), "--out", str(tmp_path / "x.tok"), "--text-key", "body"])
    err = capsys.readouterr().err
    assert code == 2 and "no key 'body'" in err and "Traceback" not in err
