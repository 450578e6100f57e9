"""``plait data prepare``: one bad record is one line naming the file, the record and the rule (issue 31
item 6) - a lone surrogate, an integer of more than 4300 digits, nesting deeper than Python's recursion
limit, and a tokenizer with an empty vocabulary ended in a traceback. No torch."""

from __future__ import annotations

import pytest

from plait.cli import main

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("name", "text", "message"), [
    ("lone.jsonl", '{"text": "ok"}\n{"text": "bad \\ud800 here"}\n',
     "lone.jsonl line 2: key 'text' holds a lone surrogate ('\\ud800' at character 4), not Unicode text"),
    ("huge.jsonl", '{"text": "ok", "n": ' + "9" * 5000 + "}\n",
     "huge.jsonl line 1 cannot be read as JSON (Exceeds the limit (4300 digits)"),
    ("deep.jsonl", '{"text": "ok", "n": ' + DEEP + "}\n", "deep.jsonl line 1 cannot be read as JSON (nested too deeply)"),
    ("deep.json", DEEP, "deep.json cannot be read as JSON (nested too deeply)"),
], ids=["lone-surrogate", "huge-integer", "deep-jsonl", "deep-json"])
def test_a_bad_record_is_one_line(tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text)
    assert main(["data", "prepare", str(tmp_path / name), "--out", str(tmp_path / "out.tok")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out.tok").exists()


def test_a_tokenizer_without_a_vocabulary_is_one_line(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={}, unk_token="[UNK]")).save(str(tmp_path / "empty.json"))
    (tmp_path / "docs.jsonl").write_text('{"text": "hello"}\n')
    assert main(["data", "prepare", str(tmp_path / "docs.jsonl"), "--tokenizer", str(tmp_path / "empty.json"),
                 "--out", str(tmp_path / "out.tok")]) == 2
    err = capsys.readouterr().err
    assert "empty.json has a vocabulary of 0 tokens; a tokenizer needs at least 2" in err and err.count("\n") == 1
