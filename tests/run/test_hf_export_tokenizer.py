"""A ``plait export`` directory is self-contained: tokenizer files, special token ids, generation config.

A tiny Llama (vocabulary 260, so the byte tokenizer's 257 ids fit) is saved as a plait checkpoint in
one process (``hf_models``' way, with the run's job as plait train records it) and exported; then
transformers' ``AutoTokenizer`` and ``AutoModelForCausalLM`` load the export, and greedy
generation gives the tokens of plait's own model (argmax of its logits, step by step: the same
weights in float32, and a margin between the top two logits far above float32's rounding checked
at every step, so that the argmax cannot flip between two correct implementations).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import hf_models  # noqa: E402
from bpe_corpus import EOS, train_bpe  # noqa: E402

from plait.cli import main  # noqa: E402
from plait.run.checkpoint.hf.export import export_checkpoint  # noqa: E402
from plait.run.checkpoint.hf.files import ExportOptions  # noqa: E402
from plait.run.checkpoint.hf.tokenizer import BYTE_EOS_ID, hf_token_ids  # noqa: E402
from plait.run.data.prepare import prepare  # noqa: E402
from plait.run.data.token_format import TokenWriter  # noqa: E402
from plait.spec.hf_config import model_from_hf_config  # noqa: E402

VOCAB = 260
PROMPT = "héllo, wörld"
NEW_TOKENS = 8


def llama_config(directory: Path, **ids) -> Path:
    from transformers import AutoConfig

    values = {**hf_models.FAMILY_SIZES, "vocab_size": VOCAB, "initializer_range": hf_models.INIT_STD, **ids}
    AutoConfig.for_model("llama", **values).save_pretrained(str(directory))
    return directory


def checkpoint_of(tmp_path: Path, spec, **job) -> tuple[Path, torch.nn.Module]:
    """A plait checkpoint of a random ``spec`` model whose run recorded ``job`` (data, token_ids...)."""
    import dataclasses

    from plait.run.checkpoint import store
    from plait.run.config import RunConfig

    torch.manual_seed(5)
    model = hf_models.plait_model(spec)
    path = hf_models.save_checkpoint(model, spec, tmp_path / "ckpt")
    manifest = json.loads((path / store.MANIFEST).read_text())
    run = RunConfig.from_dict(manifest["run"])
    run = dataclasses.replace(run, job=dataclasses.replace(run.job, **job))
    store.write_manifest(path, 1, store.file_records(path, store.data_files(path)), run.to_dict(), {})
    return path, model


def byte_tokens(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n", encoding="utf-8")
    out = tmp_path / "bytes.tok"
    prepare([corpus], out, tokenizer="bytes")
    return out


@torch.no_grad()
def plait_greedy(model, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1].double()
        top = torch.topk(logits, 2).values
        assert (top[0] - top[1]).item() > 1e-3 * logits.abs().max().item()  # no near-tie: argmax is well defined
        ids.append(int(logits.argmax()))
    return ids


def test_the_byte_tokenizer_and_the_configs_ids_make_a_model_transformers_generates_from(tmp_path):
    source = llama_config(tmp_path / "config", bos_token_id=0, eos_token_id=0, pad_token_id=None)
    spec = model_from_hf_config(source)
    ids = hf_token_ids(source)
    assert ids == {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None}
    checkpoint, model = checkpoint_of(tmp_path, spec, data=str(byte_tokens(tmp_path)), token_ids=ids)
    out = tmp_path / "exported"
    done = export_checkpoint(checkpoint, out)
    assert done.note is None
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(done.files)
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 0)  # the config's 0, not null
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (0, 0)

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert prompt == list(PROMPT.encode("utf-8"))  # the byte tokenizer: one id per UTF-8 byte
    assert tokenizer.decode(prompt) == PROMPT and tokenizer.convert_tokens_to_ids("<|endoftext|>") == BYTE_EOS_ID
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    got = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                      pad_token_id=0)[0].tolist()
    assert got == plait_greedy(model, prompt, NEW_TOKENS)


def test_without_config_ids_the_byte_tokenizers_end_of_text_is_the_eos(tmp_path):
    spec = model_from_hf_config(llama_config(tmp_path / "config"))
    checkpoint, _ = checkpoint_of(tmp_path, spec, data=str(byte_tokens(tmp_path)))  # a plait preset: no ids
    out = tmp_path / "exported"
    export_checkpoint(checkpoint, out)
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == BYTE_EOS_ID and config["bos_token_id"] is None
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == BYTE_EOS_ID


def test_a_tokenizer_named_on_the_command_line_is_copied_with_its_eos(tmp_path, capsys):
    bpe = train_bpe(tmp_path / "bpe", [EOS], vocab=VOCAB)
    spec = model_from_hf_config(llama_config(tmp_path / "config"))
    tokens = tmp_path / "bpe.tok"
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n", encoding="utf-8")
    prepare([corpus], tokens, tokenizer=str(bpe))
    checkpoint, _ = checkpoint_of(tmp_path, spec, data=str(tokens))

    assert main(["export", "--checkpoint", str(checkpoint), "--to", str(tmp_path / "bare")]) == 0
    printed = capsys.readouterr().out
    assert "no tokenizer files written" in printed and "--tokenizer" in printed  # hf:NAME: the file is not kept
    assert not (tmp_path / "bare" / "tokenizer.json").exists()

    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(checkpoint), "--to", str(out), "--tokenizer", str(bpe)]) == 0
    from tokenizers import Tokenizer

    want = Tokenizer.from_file(str(Path(bpe) / "tokenizer.json" if Path(bpe).is_dir() else bpe))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer("a b c", add_special_tokens=False)["input_ids"] == want.encode("a b c",
                                                                                  add_special_tokens=False).ids
    eos = want.token_to_id(EOS)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == eos


def test_what_cannot_be_written_is_said_in_one_line(tmp_path):
    spec = model_from_hf_config(llama_config(tmp_path / "config"))
    checkpoint, _ = checkpoint_of(tmp_path, spec)  # synthetic data
    done = export_checkpoint(checkpoint, tmp_path / "synthetic")
    assert "synthetic tokens" in done.note and "--tokenizer" in done.note
    tiktoken_file = tmp_path / "tt.tok"
    with TokenWriter(tiktoken_file, VOCAB, "tiktoken:gpt2", eos_id=7) as writer:
        writer.append([1, 2, 7])
    checkpoint, _ = checkpoint_of(tmp_path / "t", spec, data=str(tiktoken_file))
    done = export_checkpoint(checkpoint, tmp_path / "tiktoken")
    assert "tiktoken:gpt2" in done.note and "\n" not in done.note
    assert json.loads((tmp_path / "tiktoken" / "config.json").read_text())["eos_token_id"] == 7  # the header's
    with pytest.raises(Exception, match="--tokenizer"):
        export_checkpoint(checkpoint, tmp_path / "bad", ExportOptions(tokenizer=str(tmp_path / "nothing")))


def test_a_run_records_the_token_ids_of_its_hf_config(tmp_path):
    from plait.cli import build_parser
    from plait.cli.train import _request
    from plait.run.launcher.resolve import launch_options, run_config

    source = llama_config(tmp_path / "config", bos_token_id=0, eos_token_id=0)

    def recorded(model: str):
        request = _request(build_parser().parse_args(["train", "--model", model, "--layout", "dp=1",
                                                      "--global-batch", "2", "--seq-len", "16", "--device", "cpu"]))
        return run_config(request, launch_options(request, 1)).job.token_ids

    assert recorded(str(source / "config.json"))["bos_token_id"] == 0 == recorded(str(source))["eos_token_id"]
    assert recorded("tiny") is None  # a preset has no config.json
