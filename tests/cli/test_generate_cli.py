"""``plait generate``: text from a plait checkpoint (one process, any layout) or a Hugging Face directory.

A tiny random model (``hf_models.plait_model``) is saved as a dp=1 plait checkpoint in this process, its
run's token file written by the byte tokenizer; one real ``plait train`` run (dp=2, two gloo ranks,
2 steps) makes a checkpoint the way a user does. Greedy tokens are compared with transformers'
``generate(do_sample=False)`` on the ``plait export`` of the same checkpoint: the same float32
weights, and the argmax at every step is checked to lead the runner-up by far more than float32's
rounding of logits of this size (1e-4 of the largest logit: float32's 1.2e-7 relative error grown
over 128-term dot products in 4 layers stays under 1e-5), so that two correct implementations
cannot pick different tokens.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import hf_models  # noqa: E402

from plait.cli import main  # noqa: E402
from plait.run.data.prepare import prepare  # noqa: E402
from plait.spec.models import get_model  # noqa: E402

PROMPT = "Hello, world"
NEW = 20
BYTE_VOCAB = 257  # the byte tokenizer's ids: 0..255 and end-of-text 256


def byte_tokens(directory: Path) -> Path:
    corpus = directory / "corpus.txt"
    corpus.write_text("some text to train on\n" * 50, encoding="utf-8")
    out = directory / "bytes.tok"
    prepare([corpus], out, tokenizer="bytes")
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A dp=1 checkpoint of a random ``tiny`` whose run trained on a byte-tokenized file."""
    from plait.run.checkpoint import store
    from plait.run.config import RunConfig

    root = tmp_path_factory.mktemp("generate")
    spec = get_model("tiny")
    torch.manual_seed(0)
    path = hf_models.save_checkpoint(hf_models.plait_model(spec), spec, root / "ck")
    manifest = json.loads((path / store.MANIFEST).read_text())
    run = RunConfig.from_dict(manifest["run"])
    run = dataclasses.replace(run, job=dataclasses.replace(run.job, data=str(byte_tokens(root))))
    store.write_manifest(path, 1, store.file_records(path, store.data_files(path)), run.to_dict(), {})
    return root / "ck"


def generate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def generated_ids(capsys, target: Path, *args: str) -> dict:
    code, out, err = generate(capsys, "--checkpoint", str(target), "--prompt", PROMPT, "--max-new-tokens",
                              str(NEW), "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_prints_the_prompt_and_its_continuation(capsys, checkpoint):
    code, out, err = generate(capsys, "--checkpoint", str(checkpoint), "--prompt", PROMPT, "--max-new-tokens",
                              str(NEW), "--seed", "0")
    assert code == 0, err
    assert out.startswith(PROMPT) and len(out.rstrip("\n")) > len(PROMPT)
    done = generated_ids(capsys, checkpoint, "--seed", "0")
    assert done["prompt_ids"] == list(PROMPT.encode())
    assert 1 <= len(done["new_ids"]) <= NEW and all(0 <= i < BYTE_VOCAB for i in done["new_ids"])
    assert done["tokenizer"] == "bytes"


def test_the_same_seed_samples_the_same_text(capsys, checkpoint):
    sampling = ("--temperature", "0.8", "--top-k", "100", "--top-p", "0.95")
    first = generated_ids(capsys, checkpoint, *sampling, "--seed", "7")
    again = generated_ids(capsys, checkpoint, *sampling, "--seed", "7")
    other = generated_ids(capsys, checkpoint, *sampling, "--seed", "8")
    assert first == again
    assert other["new_ids"] != first["new_ids"]


def test_top_k_of_one_is_greedy(capsys, checkpoint):
    greedy = generated_ids(capsys, checkpoint, "--temperature", "0")
    assert generated_ids(capsys, checkpoint, "--top-k", "1", "--seed", "3")["new_ids"] == greedy["new_ids"]
    assert generated_ids(capsys, checkpoint, "--top-p", "1e-9", "--seed", "4")["new_ids"] == greedy["new_ids"]


@torch.no_grad()
def assert_no_near_ties(target: Path, ids: list[int]) -> None:
    """At every step of ``ids`` (prompt + greedy tokens), plait's top logit leads by far more than rounding."""
    from plait.run.generate import load_checkpoint_model

    model = load_checkpoint_model(target)[0]
    logits = model(torch.tensor([ids]))[0, len(PROMPT.encode()) - 1:-1, :BYTE_VOCAB].double()
    top = torch.topk(logits, 2, dim=-1).values
    assert bool(((top[:, 0] - top[:, 1]) > 1e-4 * logits.abs().max()).all())


def transformers_greedy(export: Path, prompt_ids: list[int], new: int) -> list[int]:
    model = hf_models.load(export)
    out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=new,
                         suppress_tokens=list(range(BYTE_VOCAB, model.config.vocab_size)))
    return out[0, len(prompt_ids):].tolist()


def importlib_find(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def check_greedy_parity(capsys, checkpoint: Path, export: Path) -> None:
    """Greedy ids from the plait checkpoint == from its export read by plait == transformers' on the export."""
    ours = generated_ids(capsys, checkpoint, "--temperature", "0")
    assert generated_ids(capsys, export, "--temperature", "0")["new_ids"] == ours["new_ids"]
    assert_no_near_ties(checkpoint, ours["prompt_ids"] + ours["new_ids"])
    if importlib_find("transformers"):
        assert transformers_greedy(export, ours["prompt_ids"], NEW) == ours["new_ids"]


def test_greedy_matches_transformers_on_the_export(capsys, checkpoint, tmp_path):
    pytest.importorskip("transformers")
    assert main(["export", "--checkpoint", str(checkpoint), "--to", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    check_greedy_parity(capsys, checkpoint, tmp_path / "hf")


def test_a_dp2_training_checkpoint_generates_as_its_export(capsys, tmp_path):
    """``plait train`` on 2 processes (dp=2) saves the checkpoint; generate reads it in one process."""
    data = byte_tokens(tmp_path)
    # in-process (the workers are processes): the test is about the checkpoint, not the command's process
    code = main(["train", "--model", "tiny", "--layout", "dp=2", "--nproc-per-node", "2", "--steps", "2",
                 "--global-batch", "4", "--seq-len", "32", "--device", "cpu", "--data", str(data),
                 "--checkpoint-dir", str(tmp_path / "ck")])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--to", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    check_greedy_parity(capsys, tmp_path / "ck", tmp_path / "hf")


def test_device_cuda_greedy_is_the_cpus_or_one_line(capsys, checkpoint):
    cpu = generated_ids(capsys, checkpoint, "--temperature", "0", "--device", "cpu")
    if torch.cuda.is_available():  # the margins of test_greedy_matches_transformers_on_the_export hold here too
        assert generated_ids(capsys, checkpoint, "--temperature", "0", "--device", "cuda")["new_ids"] == cpu["new_ids"]
    else:
        code, out, err = generate(capsys, "--checkpoint", str(checkpoint), "--prompt", PROMPT, "--device", "cuda")
        assert code == 2 and "--device cuda but torch sees no GPU" in err and len(err.strip().splitlines()) == 1


def broken_hf_directory(directory: Path, model_type: str) -> Path:
    from safetensors.torch import save_file

    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 8}))
    save_file({"w": torch.zeros(2)}, str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("args, expected", [
    (["--temperature", "-1"], "--temperature -1.0: must be >= 0"),
    (["--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p 1.5: must be in (0, 1]"),
    (["--top-k", "-1"], "--top-k -1: must be >= 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0: must be at least 1"),
    (["--max-new-tokens", "250"], "more than model tiny's 256 positions"),
    (["--tokenizer", "no-such-tokenizer"], "unknown tokenizer 'no-such-tokenizer'"),
])
def test_bad_values_are_one_line(capsys, checkpoint, args, expected):
    code, out, err = generate(capsys, "--checkpoint", str(checkpoint), "--prompt", PROMPT, *args)
    assert code == 2 and out == ""
    assert expected in err and len(err.strip().splitlines()) == 1


def test_bad_checkpoints_are_one_line(capsys, checkpoint, tmp_path):
    import shutil

    cases = [(tmp_path / "missing", "no such directory"), (tmp_path, "no valid checkpoint")]
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    data = next(p for p in (damaged / "step_00000001").iterdir() if p.suffix == ".distcp")
    data.write_bytes(b"\0" * data.stat().st_size)
    cases.append((damaged, "no valid checkpoint"))
    cases.append((broken_hf_directory(tmp_path / "ssm", "mamba"), "mamba"))
    for target, expected in cases:
        code, out, err = generate(capsys, "--checkpoint", str(target), "--prompt", PROMPT)
        assert code == 2 and out == "", target
        assert expected in err and len(err.strip().splitlines()) == 1, err


def test_synthetic_run_needs_a_tokenizer(capsys, tmp_path):
    spec = get_model("tiny")
    hf_models.save_checkpoint(hf_models.plait_model(spec), spec, tmp_path / "ck")
    code, out, err = generate(capsys, "--checkpoint", str(tmp_path / "ck"), "--prompt", PROMPT)
    assert code == 2 and "synthetic tokens (pass --tokenizer" in err and len(err.strip().splitlines()) == 1
    code, out, err = generate(capsys, "--checkpoint", str(tmp_path / "ck"), "--prompt", PROMPT, "--tokenizer",
                              "bytes", "--max-new-tokens", "3")
    assert code == 0 and out.startswith(PROMPT), err
