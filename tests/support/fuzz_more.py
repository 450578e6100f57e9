"""More fuzzed commands for bench/fuzz_cli.py (issue 31 item 6): ``data prepare`` with mutated JSON-lines
records, ``train`` with a mutated TOML job file, ``export`` of a checkpoint with a mutated manifest and
DCP metadata, and ``train --init-from`` of a Hugging Face directory with a mutated config.json and
weight file. Cases as in tests/support/fuzz_inputs.py: (argv, {file name: text or bytes})."""

from __future__ import annotations

import json
import struct

from fuzz_inputs import BAD_TEXT, HF_CONFIG, argv_of, flag_values, mutated_json
from hypothesis import strategies as st

DEEP = "[" * 3000 + "]" * 3000
# lines of a .jsonl file: good records, and what a broken exporter writes
RECORDS = ['{"text": "hello world"}', '{"text": ""}', '{"text": null}', '{"text": 5}', '{"text": ["a"]}',
           '{"other": "x"}', '{"text": "bad \\ud800 surrogate"}', '{"text": "ok", "n": ' + "9" * 5000 + "}",
           '{"text": "ok", "n": ' + DEEP + "}", "[1, 2]", "not json", "{", '"just a string"', "",
           '{"text": "\\u0000 nul"}', '{"text": "' + "long " * 2000 + '"}', "\ufeff{\"text\": \"bom\"}"]
# values of a TOML job file's keys (TOML text)
BAD_TOML = ["0", "-1", "1.5", "-1e300", "1e400", "nan", "inf", "-inf", "true", "\"x\"", "\"\"", "[]", "[1, 2]",
            "{a = 1}", "9" * 5000, "9" * 4000, "1" + "0" * 30, DEEP, "\"dp=2\"", "\"tiny\"", "2024-01-01",
            "0x10", "1_000"]
TOML_KEYS = ["model", "layout", "global_batch", "seq_len", "steps", "seed", "lr", "warmup_steps", "weight_decay",
             "grad_clip", "lr_schedule", "min_lr", "decay_fraction", "data", "log_every", "timeout", "on_nan",
             "nproc_per_node", "checkpoint_every", "keep_checkpoints", "unknown_key", "eval_every", "eval_steps"]
METADATA = [b"", b"not a pickle", b"\x80\x04K\x01.", b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix"
            b"\x94\x8c\x06system\x94\x93\x94.", b"\x80\x04}\x94.", b"\x80\x04N."]


@st.composite
def prepare_case(draw):
    lines = draw(st.lists(st.sampled_from(RECORDS), min_size=1, max_size=6))
    files = {"docs.jsonl": "\n".join(lines) + draw(st.sampled_from(["\n", ""]))}
    argv = argv_of(["data", "prepare", "docs.jsonl", "--out", draw(st.sampled_from(["out.tok", ".", "docs.jsonl"]))],
                   draw(flag_values({"--workers": "1", "--text-key": "text"})))
    extra = draw(st.sampled_from([[], ["--eos-id", draw(st.sampled_from(BAD_TEXT))],
                                  ["--val-fraction", draw(st.sampled_from(BAD_TEXT)), "--val-out", "val.tok"]]))
    return argv + extra, files


@st.composite
def toml_case(draw):
    keys = draw(st.lists(st.sampled_from(TOML_KEYS), min_size=1, max_size=4, unique=True))
    text = "".join(f"{key} = {draw(st.sampled_from(BAD_TOML))}\n" for key in keys)
    if draw(st.integers(0, 7)) == 7:
        text = f"[{draw(st.sampled_from(['optimizer', 'checkpoints', 'x', 'where']))}]\n" + text
    argv = ["train", "--config", "run.toml", "--model", "tiny", "--global-batch", "8", "--seq-len", "32",
            "--device", "cpu", "--dry-run"]
    return argv, {"run.toml": text}


_RUN: dict = {}


def _manifest(metadata: bytes) -> dict:
    """A valid plait checkpoint manifest of the tiny model (what ``plait.run.checkpoint.store`` writes) over
    one file, ``.metadata``, holding ``metadata``."""
    import zlib

    from plait.run.checkpoint import store
    from plait.run.launcher.request import TrainRequest
    from plait.run.launcher.resolve import fresh_config

    if not _RUN:
        _RUN.update(fresh_config(TrainRequest(model="tiny", global_batch=8, seq_len=32, device="cpu")).config.to_dict())
    body = {"format": store.FORMAT, "version": store.VERSION, "step": 1, "created": "2026-01-01T00:00:00",
            "files": {".metadata": {"bytes": len(metadata), "crc32": f"{zlib.crc32(metadata):08x}"}},
            "run": _RUN, "layout": "dp=1", "world_size": 1}
    body["checksum"] = store.manifest_checksum(body)
    return body


@st.composite
def export_case(draw):
    metadata = draw(st.sampled_from(METADATA))
    files = {"ck/step_00000001/manifest.json": draw(mutated_json(_manifest(metadata))),
             "ck/step_00000001/.metadata": metadata}
    argv = argv_of(["export", "--checkpoint", draw(st.sampled_from(["ck", "ck", "ck/step_00000001", "missing"])),
                    "--to", draw(st.sampled_from(["hf", "hf", "ck", "."]))],
                   draw(flag_values({"--max-shard-size": "5GB", "--dtype": "bf16"})))
    return argv, files


def _safetensors(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@st.composite
def init_from_case(draw):
    shape = [draw(st.sampled_from([0, 1, 2, 4, 10**12, -1]))]
    begin, end = draw(st.sampled_from([(0, 8), (0, 4), (4, 2), (0, 10**15), (0, 0)]))
    header = {"model.embed_tokens.weight": {"dtype": draw(st.sampled_from(["F32", "BF16", "X9", 3])),
                                            "shape": draw(st.sampled_from([shape, "x", [1, "a"], None])),
                                            "data_offsets": draw(st.sampled_from([[begin, end], "x", [1]]))}}
    weights = draw(st.sampled_from([_safetensors(header, b"\0" * 8), b"", b"\xff" * 8, _safetensors(header, b""),
                                    struct.pack("<Q", 10**12) + b"{}"]))
    files = {"hf/config.json": draw(mutated_json(HF_CONFIG)), "hf/model.safetensors": weights}
    argv = argv_of(["train", "--init-from", "hf"], draw(flag_values({"--global-batch": "4", "--seq-len": "16"})))
    return argv + ["--device", "cpu", "--dry-run"], files


MORE_CASES = {"data prepare": prepare_case, "train --config": toml_case, "export": export_case,
              "train --init-from": init_from_case}

