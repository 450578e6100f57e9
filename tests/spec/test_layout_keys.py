"""Layout keys are declared once (a KeySpec per field): parse, print, checks and docs follow."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plait.errors import PlaitError
from plait.spec.layout import LAYOUT_KEYS, Layout, layout_keys_markdown
from plait.spec.layout_keys import KeySpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "layout-keys.md"
LAYOUTS_DOC = DOC.parent / "layouts.md"


def test_docs_table_is_generated_from_the_declaration():
    assert DOC.read_text() == layout_keys_markdown(), (
        "docs/layout-keys.md is stale: write plait.spec.layout.layout_keys_markdown() into it")


def test_layouts_doc_table_is_generated_from_the_declaration():
    text = LAYOUTS_DOC.read_text()
    start = text.index("-->\n", text.index("<!-- layout-keys:")) + len("-->\n")
    assert text[start:text.index("<!-- /layout-keys -->")] == layout_keys_markdown(), (
        "docs/layouts.md's layout key table is stale: paste plait.spec.layout.layout_keys_markdown() between its markers")


def test_every_field_is_declared():
    for field in dataclasses.fields(Layout):
        assert isinstance(field.metadata.get("key"), KeySpec), field.name
    assert list(LAYOUT_KEYS) == [f.name for f in dataclasses.fields(Layout)]


def test_every_key_is_documented_and_known():
    table = layout_keys_markdown()
    with pytest.raises(PlaitError) as info:
        Layout.parse("nope=1")
    known = str(info.value).split("known keys: ")[1].split(", ")
    for name, (spec, _) in LAYOUT_KEYS.items():
        assert (f"| `{name}` |" in table) == spec.own_key, name
        assert (name in known) == spec.own_key, name
    assert "offload_target" not in known  # written inside offload=disk:0.5 only


@pytest.mark.parametrize("text", [
    "dp=8,tp=4,pp=2,mbs=1,ckpt=selective",
    "pp=4,vpp=2",  # default schedule interleaved-1f1b: not printed
    "pp=4,vpp=2,schedule=gpipe",
    "pp=2,schedule=zb",
    "ckpt=full:4", "ckpt=full,ckpt_layers=3",
    "offload=0.5", "offload=disk:1", "offload=disk:0", "offload=cpu:0.25",
    "dp=4,zero=3,hsdp=2,reshard=0,sp=0,opt_offload=1,precision=fp8,attn=eager,order=dp-tp-cp-pp,"
    "cp_impl=ulysses,split=uneven",
])
def test_round_trip(text):
    layout = Layout.parse(text)
    assert Layout.parse(str(layout)) == layout
    assert Layout.from_dict(layout.to_dict()) == layout


def test_special_syntaxes():
    assert Layout.parse("ckpt=full:4") == Layout(ckpt="full", ckpt_layers=4)
    assert str(Layout.parse("ckpt=full:4")) == "dp=1,tp=1,pp=1,cp=1,mbs=1,ckpt=full:4"
    assert Layout.parse("offload=disk:0.5") == Layout(offload=0.5, offload_target="disk")
    assert str(Layout.parse("offload=0.5")).endswith("offload=cpu:0.5")
    assert Layout.parse("pp=2,vpp=2").schedule == "interleaved-1f1b"
    assert Layout.parse("pp=2,schedule=zb").schedule == "zero-bubble"
    assert str(Layout(pp=2, vpp=2)) == "dp=1,tp=1,pp=2,cp=1,vpp=2,mbs=1,schedule=1f1b"
    assert str(Layout(reshard=False, opt_offload=True)).endswith("reshard=0,opt_offload=1")


@pytest.mark.parametrize("text,message", [
    ("zero=4", "zero=4 must be 0, 1, 2 or 3"),
    ("ckpt=full:x", "layout key ckpt layers='x' must be an integer"),
    ("ckpt=full:-1", "ckpt_layers=-1 must be a non-negative integer"),
    ("split=odd", "split='odd' must be one of even, uneven, ends"),
    ("attn=xformers", "attn='xformers' must be one of flash, sdpa, flex, eager"),
    ("offload=tape:0.5", "offload target 'tape' must be cpu or disk"),
    ("offload=x", "offload='x' must be a fraction, or cpu:FRACTION / disk:FRACTION"),
    ("cp_impl=mesh", "cp_impl='mesh' must be one of ring, allgather, torch, ulysses"),
    ("sp=maybe", "layout key sp='maybe' must be 1/0 (or true/false)"),
    ("offload_target=disk", "unknown layout key 'offload_target'"),
    ("ckpt_layers=2,ckpt=full:2", "layout key 'ckpt' given twice"),
    ("offload=0.5,offload=1", "layout key 'offload' given twice"),
    ("dp=0,mbs=-1", "invalid layout: dp=0 must be a positive integer; mbs=-1 must be a positive integer"),
])
def test_errors(text, message):
    with pytest.raises(PlaitError) as info:
        Layout.parse(text)
    assert message in str(info.value)


def test_parse_fixed():
    assert Layout.parse_fixed([]) == ()
    assert Layout.parse_fixed(["tp=8", "ckpt=full:4", "schedule=zb", "PP=2"]) == (
        ("ckpt", "full"), ("pp", 2), ("schedule", "zero-bubble"), ("tp", 8))
    assert Layout.parse_fixed(["sp=0", "zero=3"]) == (("sp", False), ("zero", 3))
    with pytest.raises(PlaitError, match="--fix offload is not supported"):
        Layout.parse_fixed(["offload=0.5"])
    with pytest.raises(PlaitError, match="unknown layout key"):
        Layout.parse_fixed(["bogus=1"])
    with pytest.raises(PlaitError, match="must be one of"):
        Layout.parse_fixed(["ckpt=sometimes"])


def test_a_new_key_needs_only_its_declaration():
    """What adding a key takes: one ``layout_key`` field; parsing, printing, checks and docs follow."""
    from dataclasses import dataclass

    from plait.spec.layout_keys import format_value, key_specs, keys_markdown, layout_key, parse_value, problems

    @dataclass(frozen=True)
    class Knobs:
        fused_norm: bool = layout_key(False, "bool", "fused RMSNorm kernel")
        gemm_tile: int = layout_key(128, "int", "GEMM tile size", choices=(64, 128, 256))

    keys = key_specs(Knobs)
    assert keys_markdown(keys).splitlines()[2:] == [
        "| `fused_norm` | 1 / 0 | 0 | fused RMSNorm kernel |", "| `gemm_tile` | 64, 128, 256 | 128 | GEMM tile size |"]
    assert parse_value("fused_norm", keys["fused_norm"][0], "on") == {"fused_norm": True}
    assert format_value("fused_norm", keys["fused_norm"][0], True, False) == "fused_norm=1"
    assert problems(Knobs(gemm_tile=96), keys) == ["gemm_tile=96 must be 64, 128 or 256"]
