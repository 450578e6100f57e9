"""Every input is checked where it enters (issue 15): GpuSpec and ClusterSpec refuse a 0, null,
string, negative, NaN or infinite field with one line naming the field and the value; every JSON
reader refuses NaN, Infinity, 1e400, a 4,400-digit integer and deep nesting; ``plait validate``
marks a bad CSV row ``invalid: <reason>`` and goes on with the others."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from fuzz_inputs import CLUSTER, HF_CONFIG, RUN_HEADER, RUN_ROWS

from plait.cli import main
from plait.errors import PlaitError
from plait.measure.validate.runs import predict_runs
from plait.spec.hardware import CLUSTERS, GPUS, ClusterSpec, GpuSpec, get_cluster
from plait.spec.hf_config import model_from_hf_config
from plait.spec.layout import JobSpec, Layout
from plait.spec.model import ModelSpec
from plait.spec.serialize import parse_json

BAD_NUMBERS = [0, None, "8", -1.0, math.nan, math.inf, True]
GPU_FIELDS = ["bf16_flops", "hbm_bytes", "hbm_bandwidth", "gemm_efficiency", "attention_efficiency",
              "memory_efficiency"]
CLUSTER_FIELDS = ["gpus_per_node", "intra_node_bandwidth", "inter_node_bandwidth", "host_link_bandwidth",
                  "link_efficiency", "n_gpus"]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("field", GPU_FIELDS)
def test_gpu_fields_are_checked(field, value):
    with pytest.raises(PlaitError) as info:
        dataclasses.replace(GPUS["h100-sxm"], **{field: value})
    text = str(info.value)
    assert f"{field}={value!r}" in text and "\n" not in text


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("field", CLUSTER_FIELDS)
def test_cluster_fields_are_checked(field, value):
    with pytest.raises(PlaitError) as info:
        dataclasses.replace(CLUSTERS["dgx-h100"], **{field: value})
    assert f"{field}={value!r}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("field,value", [("fp8_flops", -1.0), ("kernel_overhead", -1e-6), ("gemm_efficiency", 1.5),
                                         ("intra_node_latency", -5e-6), ("name", ""), ("gpu", "h100-sxm")])
def test_ranges_and_types(field, value):
    spec = GPUS["h100-sxm"] if field in {f.name for f in dataclasses.fields(GpuSpec)} else CLUSTERS["dgx-h100"]
    with pytest.raises(PlaitError, match=field):
        dataclasses.replace(spec, **{field: value})


def test_every_preset_passes():
    assert all(isinstance(c, ClusterSpec) for c in CLUSTERS.values())  # built at import: all valid


def test_negative_bandwidth_in_a_cluster_file_is_refused_not_ranked(tmp_path, capsys):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({**CLUSTER, "inter_node_bandwidth": -5e10}))
    code = main(["plan", "--model", "tiny", "--cluster", str(path), "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "64"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "inter_node_bandwidth=-50000000000.0" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 4400, "[" * 100_000])
def test_json_readers_refuse_what_is_not_a_finite_number(tmp_path, raw):
    with pytest.raises(ValueError):
        parse_json(f'{{"x": {raw}}}')
    config = dict(HF_CONFIG)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config).replace('"hidden_size": 64', f'"hidden_size": {raw}'))
    with pytest.raises(PlaitError, match="not a valid Hugging Face config.json"):
        model_from_hf_config(path)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(CLUSTER).replace('"gpus_per_node": 8', f'"gpus_per_node": {raw}'))
    with pytest.raises(PlaitError, match="not a valid cluster file"):
        get_cluster(str(cluster))


def test_from_json_is_strict_too():
    with pytest.raises(ValueError):
        ModelSpec.from_json('{"name": "m", "hidden": NaN}')
    with pytest.raises(ValueError):
        Layout.from_json('{"dp": Infinity}')


def test_sizes_past_the_planners_range_are_refused():
    with pytest.raises(PlaitError, match="hidden=.* is more than"):
        dataclasses.replace(ModelSpec("m", "llama", 2, 64, 128, 4, 4, 256), hidden=2**40)
    with pytest.raises(PlaitError, match="global_batch=.* is more than"):
        JobSpec(global_batch=2**40, seq_len=8)
    with pytest.raises(PlaitError, match="dp=.* is more than"):
        Layout(dp=2**40)


@pytest.mark.parametrize("change,reason", [
    (("pp", "0"), "pp='0' must be a positive integer"),
    (("hidden", "wide"), "hidden='wide' must be a positive integer"),
    (("n_gpus", "-8"), "n_gpus='-8' must be a positive integer"),
    (("short", None), "the row has fewer fields than the header"),
    (("long", None), "the row has more fields than the header"),
])
def test_a_bad_row_is_invalid_and_the_others_are_predicted(tmp_path, capsys, change, reason):
    rows = [list(r) for r in RUN_ROWS]
    column, value = change
    if column == "short":
        rows[0] = rows[0][:5]
    elif column == "long":
        rows[0] = rows[0] + ["9"]
    else:
        rows[0][RUN_HEADER.index(column)] = value
    path = tmp_path / "runs.csv"
    path.write_text("\n".join(",".join(r) for r in [RUN_HEADER, *rows]) + "\n")
    results = predict_runs(path)
    assert results[0].status == f"invalid: {reason}"
    assert all(not r.status.startswith("invalid") for r in results[1:])
    assert main(["validate", "--runs", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == len(rows) and summary["invalid"] == 1
