"""Mutated command lines and input files for the CLI fuzz test (tests/cli/test_fuzz_cli.py) and its
benchmark (bench/fuzz_cli.py): a valid base input with one to three fields replaced by values a user
(or a broken tool) could write - 0, null, strings, negatives, NaN, Infinity, 1e400, a 4,400-digit
integer, wrong JSON types, missing keys, short CSV rows. ``run_cli`` runs ``plait.cli.main`` in-process
and says how it ended: an exit status, or the traceback of an exception that escaped.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import signal
import traceback
from pathlib import Path

from hypothesis import strategies as st

# JSON text (not values): some are not valid JSON values in Python's json.dumps sense
BAD_JSON = ["0", "-1", "-0.5", "0.5", "2", "3.7", "1e300", "1e-300", "-1e300", "null", "true", "\"x\"", "\"\"",
            "[]", "{}", "[1, 2]", "NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 4400,
            "99999999999999999999", "\"h100-sxm\"", "\"8\"", "{\"a\": 1}"]
# command-line values and CSV cells
BAD_TEXT = ["0", "-1", "-4", "1", "2", "3", "7", "0.5", "1.5", "x", "", " ", "nan", "inf", "-inf", "1e400",
            "1e300", "1" + "0" * 5000, "99999999999", "dp=0", "tp=3,pp=0", "pp=2,vpp=2", "zero=9", "=", ",",
            "a=b", "ckpt=full,ckpt=none", "dp=2,tp=2", "tiny", "llama3-8b", "dgx-h100", "h100-sxm", "-",
            "\u00e9\u00e8", "1,2", "\"", "yes", "full", "selective", "3", "fsdp"]

TINY_MODEL = {"name": "tiny-json", "arch": "llama", "n_layers": 4, "hidden": 64, "ffn_hidden": 176,
              "n_heads": 4, "n_kv_heads": 2, "vocab": 512, "max_seq_len": 256, "tied_embeddings": False,
              "dropout": False}
HF_CONFIG = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "num_hidden_layers": 4, "intermediate_size": 176, "vocab_size": 512,
             "max_position_embeddings": 256, "tie_word_embeddings": False}
CLUSTER = {"name": "fuzz-node", "gpu": {"name": "fuzz-gpu", "bf16_flops": 1e15, "fp8_flops": 2e15,
                                        "hbm_bytes": 8.5e10, "hbm_bandwidth": 3.3e12, "gemm_efficiency": 0.65,
                                        "attention_efficiency": 0.3, "memory_efficiency": 0.8,
                                        "kernel_overhead": 6e-6},
           "gpus_per_node": 8, "intra_node_bandwidth": 4.5e11, "inter_node_bandwidth": 5e10,
           "intra_node_latency": 5e-6, "inter_node_latency": 1.2e-5, "host_link_bandwidth": 5e10,
           "link_efficiency": 0.8, "n_gpus": 8, "gpus_per_nic": 1}
CPU_CALIBRATION = {"format": "plait-calibration/1", "gpu": None, "device": "cpu", "processes_per_node": 2,
                   "threads_per_process": 1, "params": {"step_overhead_s": 0.01, "layer_overhead_s": 0.001},
                   "gpu_overrides": {"bf16_flops": 1e11}}
CALIBRATION = {"format": "plait-calibration/1", "gpu": "h100-sxm", "device": "cuda",
               "params": {"elementwise_passes": 40.0, "dp_overlap": 0.7, "step_overhead_s": 0.01},
               "gpu_overrides": {"gemm_efficiency": 0.6}, "cluster_overrides": {"link_efficiency": 0.7}}
RUN_HEADER = ["id", "source", "arch", "n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab",
              "seq_len", "gpu_type", "n_gpus", "tp", "pp", "dp", "mbs", "gbs", "zero_stage", "recompute",
              "reported_mfu", "reported_tokens_per_s_per_gpu"]
RUN_ROWS = [["r1", "Narayanan et al. 2021", "gpt", "24", "2304", "9216", "24", "24", "51200", "2048", "a100", "32",
             "1", "1", "32", "4", "512", "1", "full", "", "3000"],
            ["r2", "torchtitan", "llama", "32", "4096", "14336", "32", "8", "128256", "8192", "h100", "64",
             "2", "1", "32", "1", "256", "fsdp", "selective", "0.4", ""],
            ["r3", "torchtitan", "llama", "32", "4096", "14336", "32", "8", "128256", "8192", "h100", "64",
             "", "", "16", "1", "256", "3", "full", "0.35", ""]]

SWEEP_HEADER = ["layout", "status", "reason", "compile", "planner_rank", "predicted_fits", "predicted_step_time_s",
                "measured_step_time_s", "step_time_error", "predicted_memory_bytes", "measured_memory_bytes",
                "memory_kind", "memory_error", "predicted_mfu", "measured_mfu", "mfu_error", "tokens_per_s", "model",
                "global_batch", "seq_len", "nproc_per_node", "steps", "device", "gpu", "calibration",
                "calibration_sha256", "elapsed_s"]
_SWEEP_TAIL = ["cuda_allocated", "0.1", "0.022", "0.02", "-0.09", "15058.8", "tiny", "8", "64", "2", "5", "cuda",
               "h100-sxm", "", "", ""]
SWEEP_ROWS = [["dp=2,tp=1,pp=1,cp=1,mbs=1", "ok", "", "0", "1", "", "0.03", "0.034", "0.13", "3e+07", "3.3e+07",
               *_SWEEP_TAIL],
              ["dp=1,tp=1,pp=2,cp=1,mbs=2", "ok", "", "0", "2", "", "0.05", "0.048", "-0.04", "3e+07", "3.3e+07",
               *_SWEEP_TAIL],
              ["dp=1,tp=3,pp=1,cp=1,mbs=1", "invalid", "needs 3 processes", "0", "", "", "", "", "", "", "",
               *_SWEEP_TAIL]]


def _plans() -> list[dict]:
    """Two saved plans of the tiny model (``Plan.to_dict``, what ``plait plan --save`` writes)."""
    from plait.plan.plan import evaluate
    from plait.spec.hardware import get_cluster
    from plait.spec.layout import JobSpec, Layout
    from plait.spec.models import get_model

    cluster, job = get_cluster("dgx-h100", 2), JobSpec(global_batch=8, seq_len=64)
    return [evaluate(get_model("tiny"), cluster, job, Layout.parse(text)).to_dict()
            for text in ("dp=2", "pp=2,mbs=1")]


PLANS = _plans()


def generated_json():
    """JSON text of a value hypothesis makes up: any integer, any finite float, a short string, or BAD_JSON."""
    return st.one_of(st.sampled_from(BAD_JSON), st.integers().map(str),
                     st.floats(allow_nan=False, allow_infinity=False).map(repr), st.text(max_size=6).map(json.dumps))


def generated_text():
    """A CSV cell hypothesis makes up: any integer or float as text (NaN, inf included), a short string of
    any characters (commas, quotes, newlines, NUL), or BAD_TEXT."""
    return st.one_of(st.sampled_from(BAD_TEXT), st.integers().map(str), st.floats().map(repr),
                     st.text(max_size=8))


@st.composite
def mutated_json(draw, base: dict, generated: bool = False) -> str:
    """``base`` as JSON text with one to three values replaced by BAD_JSON (``generated``: also by values
    hypothesis makes up, ``generated_json``), removed, or an unknown key added (any depth), or the whole
    text truncated."""
    data = json.loads(json.dumps(base))
    raws: dict[str, str] = {}
    for i in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        holder = data
        while True:  # walk down to a dict holding the value to change
            keys = sorted(holder) if isinstance(holder, dict) else []
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            if isinstance(holder[key], dict) and draw(st.booleans()):
                holder = holder[key]
                continue
            action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
            if action == "delete":
                del holder[key]
            elif action == "add":
                holder[f"unknown_{i}"] = 1
            else:
                holder[key] = f"@@RAW{i}@@"
                raws[f"\"@@RAW{i}@@\""] = draw(generated_json() if generated else st.sampled_from(BAD_JSON))
            break
    text = json.dumps(data)
    for placeholder, raw in raws.items():
        text = text.replace(placeholder, raw)
    if draw(st.integers(0, 15)) == 15:
        text = text[:draw(st.integers(0, len(text)))]
    elif draw(st.integers(0, 15)) == 15:
        text = draw(st.sampled_from(BAD_JSON))  # not an object at all
    return text


@st.composite
def mutated_csv(draw, header: list[str], rows: list[list[str]], generated: bool = False) -> str:
    """A CSV: the header and rows with cells replaced by BAD_TEXT (``generated``: also by cells hypothesis
    makes up, ``generated_text``, header cells included), rows cut short or made longer."""
    table = [list(header)] + [list(r) for r in rows]
    for _ in range(draw(st.integers(0, 4))):
        r = draw(st.integers(0 if generated else 1, len(table) - 1))
        action = draw(st.sampled_from(["cell", "cell", "cell", "short", "long", "drop column"]))
        if action == "cell" and table[r]:
            table[r][draw(st.integers(0, len(table[r]) - 1))] = draw(generated_text() if generated
                                                                       else st.sampled_from(BAD_TEXT))
        elif action == "short":
            table[r] = table[r][:draw(st.integers(0, len(table[r])))]
        elif action in ("long", "cell"):
            table[r] = table[r] + ["9"]
        else:
            column = draw(st.integers(0, len(header) - 1))
            table = [row[:column] + row[column + 1:] for row in table]
    buffer = io.StringIO()
    csv.writer(buffer).writerows(table)
    return buffer.getvalue()


@st.composite
def flag_value(draw, value: str) -> str | None:
    """``value`` (6 times in 8: hypothesis favours small integers, so 0..5 keep it), a BAD_TEXT, or None."""
    pick = draw(st.integers(0, 7))
    return value if pick < 6 else draw(st.sampled_from(BAD_TEXT)) if pick == 6 else None


def flag_values(defaults: dict[str, str]):
    """{flag: value} with each default kept, replaced by BAD_TEXT, or left out (None)."""
    return st.fixed_dictionaries({flag: flag_value(value) for flag, value in defaults.items()})


def argv_of(command: list[str], flags: dict[str, str | None]) -> list[str]:
    return list(command) + [word for flag, value in flags.items() if value is not None for word in (flag, value)]


# Each case is (argv, files): file names in argv are relative to the directory the files are written to.
@st.composite
def plan_case(draw):
    files = {}
    model = draw(st.sampled_from(["tiny", "model.json", "hf/config.json", "hf"]))
    if model == "model.json":
        files[model] = draw(mutated_json(TINY_MODEL))
    elif model.startswith("hf"):
        files["hf/config.json"] = draw(mutated_json(HF_CONFIG))
    cluster = draw(st.sampled_from(["dgx-h100", "cluster.json", "cluster.json"]))
    if cluster == "cluster.json":
        files[cluster] = draw(mutated_json(CLUSTER))
    flags = draw(flag_values({"--gpus": "2", "--global-batch": "8", "--seq-len": "64"}))
    # a full search takes ~0.1 s: one case in eight searches, the others evaluate one layout
    layout = draw(st.one_of(st.sampled_from(["dp=2", "tp=2", "pp=2,mbs=1", "dp=2,zero=3,ckpt=full"]),
                            st.sampled_from(BAD_TEXT), st.just(None) if draw(st.integers(0, 7)) == 7
                            else st.just("dp=2")))
    extra = {"--layout": layout}
    if draw(st.booleans()):
        files["calibration.json"] = draw(mutated_json(CALIBRATION))
        extra["--calibration"] = "calibration.json"
    if layout is None:
        extra.update(draw(flag_values({"--top": "2", "--max-pp": "2", "--fix": "tp=1"})))
    extra["--save"] = draw(st.sampled_from([None, None, "saved.json", ".", "missing/dir/plan.json"]))
    options = draw(st.sampled_from([[], ["--json"], ["--explain"], ["--any-runtime"]]))
    return argv_of(["plan", "--model", model, "--cluster", cluster], {**flags, **extra}) + options, files


@st.composite
def validate_case(draw):
    files = {"runs.csv": draw(mutated_csv(RUN_HEADER, RUN_ROWS, generated=True))}
    argv = ["validate", "--runs", "runs.csv"]
    if draw(st.booleans()):
        files["calibration.json"] = draw(mutated_json(draw(st.sampled_from([CALIBRATION, CPU_CALIBRATION])),
                                                      generated=True))
        argv += ["--calibration", "calibration.json"]
    argv += draw(st.sampled_from([[], ["--json"], ["--out", "predictions.csv"], ["--out", "."]]))
    return argv, files


@st.composite
def train_case(draw):
    files = {}
    if draw(st.integers(0, 3)) == 3:
        files["plan.json"] = draw(mutated_json(draw(st.sampled_from(PLANS))))
        argv = ["train", "--plan", "plan.json"]
    else:
        model = draw(st.sampled_from(["tiny", "model.json", "hf"]))
        if model == "model.json":
            files[model] = draw(mutated_json(TINY_MODEL))
        elif model == "hf":
            files["hf/config.json"] = draw(mutated_json(HF_CONFIG))
        argv = argv_of(["train", "--model", model], draw(flag_values(
            {"--layout": "dp=1", "--global-batch": "8", "--seq-len": "64"})))
    argv += argv_of([], draw(flag_values({"--steps": "2", "--seed": "0", "--lr": "0.001", "--nproc-per-node": "1"})))
    argv += argv_of([], {key: draw(st.sampled_from(BAD_TEXT)) for key in
                         draw(st.lists(st.sampled_from(["--warmup-steps", "--weight-decay", "--grad-clip", "--gpus",
                                                        "--nnodes", "--keep-checkpoints", "--checkpoint-every",
                                                        "--log-every", "--timeout", "--max-restarts"]),
                                       max_size=2, unique=True))})
    return argv + ["--device", "cpu", "--dry-run"], files


@st.composite
def report_case(draw):
    files = {"sweep.csv": draw(mutated_csv(SWEEP_HEADER, SWEEP_ROWS))}
    argv = ["report", "--sweep", "sweep.csv", "--out", draw(st.sampled_from(["report", "report", "sweep.csv"]))]
    summary = {"top1_tolerance": 0.03, "calibration": None} if draw(st.booleans()) else None
    if draw(st.booleans()):  # the sweep's calibration: a GPU's or a CPU profile (the plan is for H100s)
        files["calibration.json"] = draw(mutated_json(draw(st.sampled_from([CALIBRATION, CPU_CALIBRATION]))))
        summary = {"top1_tolerance": 0.03, "calibration": "calibration.json"}
    if summary is not None:
        files["sweep.summary.json"] = draw(mutated_json(summary))
    if draw(st.booleans()):
        files["plan.json"] = draw(mutated_json(draw(st.sampled_from(PLANS))))
        argv += ["--plan", "plan.json"]
    return argv, files


@st.composite
def calibrate_case(draw):
    files = {"runs.csv": draw(mutated_csv(RUN_HEADER, RUN_ROWS, generated=True))}
    argv = ["calibrate", "fit", "--runs", "runs.csv", "--out", draw(st.sampled_from(["fit.json", ".", "fit.txt"])),
            "--no-leave-out"]
    argv += argv_of([], draw(flag_values({"--rounds": "1", "--points": "2", "--params": "dp_overlap"})))
    if draw(st.booleans()):
        files["calibration.json"] = draw(mutated_json(draw(st.sampled_from([CALIBRATION, CPU_CALIBRATION])),
                                                      generated=True))
        argv += ["--calibration", "calibration.json"]
    argv += draw(st.sampled_from([[], ["--json"], ["--metric", "step_time"], ["--gpu", "h100-sxm"], ["--gpu", "x"]]))
    return argv, files


CASES = {"plan": plan_case, "validate": validate_case, "train --dry-run": train_case, "report": report_case,
         "calibrate fit": calibrate_case}


class Hang(Exception):
    """The command ran longer than the fuzzer allows one case (a loop over a huge number)."""


def _hang(signum, frame):
    raise Hang("the command ran for more than TIME_LIMIT_S seconds")


TIME_LIMIT_S = 10.0  # CPU seconds, so that a loaded machine does not make a slow case a hang


def run_cli(argv: list[str]) -> tuple[int | None, str]:
    """(exit status, output) of ``plait.cli.main(argv)`` run in-process; (None, traceback) when an
    exception other than SystemExit escaped (argparse's usage errors exit 2 through SystemExit), or
    the command ran for more than TIME_LIMIT_S seconds of CPU time."""
    from plait.cli import main

    out = io.StringIO()
    previous = signal.signal(signal.SIGPROF, _hang)
    signal.setitimer(signal.ITIMER_PROF, TIME_LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except Exception:  # noqa: BLE001 - what the fuzzer is looking for
        return None, traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    return code, out.getvalue()


def run_case(case: tuple[list[str], dict[str, str]], directory: Path) -> tuple[int | None, str]:
    """Write the case's files into ``directory`` (emptied first) and run its command line there."""
    import os
    import shutil

    for entry in directory.iterdir():
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    argv, files = case
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            (directory / name).write_bytes(text)
        else:
            (directory / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    here = os.getcwd()
    os.chdir(directory)
    try:
        return run_cli(argv)
    finally:
        os.chdir(here)


def ended_well(code: int | None, output: str) -> bool:
    """Exit 0, 1 or 2 and no traceback in what was printed."""
    return code in (0, 1, 2) and "Traceback" not in output
