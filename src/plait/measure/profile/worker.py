"""The process torchrun starts on every rank for ``plait profile``: ``-m plait.measure.profile.worker DIR``.

``DIR/profile-config.json`` says what to measure (written by ``plait.measure.profile.machine``). Every
rank times the compute benchmarks (GEMMs, attention, copies, launches, host link) at the same time,
as training runs them (on a CPU the processes share the cores and the memory bus), and rank 0's
times are kept; a rank that finishes first waits on a gloo barrier whose timeout is
``compute_wait_s`` (not the collective timeout). Then every rank runs the collectives, the
overlap benchmark and (CPU) the runtime's host time per layer
(``plait.measure.profile.runtime_cost``). Rank 0 writes ``DIR/raw.json``; a failing rank writes
``DIR/error-rank<R>.json`` like the training worker (the launcher reports the first failure).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from plait.measure.profile import bench, runtime_cost
from plait.progress import ProgressBar
from plait.run.env import RankEnv


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_and_versions(device: torch.device, env: RankEnv) -> tuple[dict, dict]:
    from plait import __version__

    machine = {"hostname": socket.gethostname(), "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
               "threads_per_process": torch.get_num_threads(), "platform": platform.platform(),
               "nnodes": env.group_world_size,
               "nproc_per_node": env.local_world_size,
               "world_size": dist.get_world_size()}
    versions = {"plait": __version__, "torch": torch.__version__, "python": platform.python_version(),
                "backend": dist.get_backend()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        machine.update(gpu=torch.cuda.get_device_name(device), gpu_count=torch.cuda.device_count(),
                       gpu_memory_bytes=props.total_memory)
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
        versions.update(cuda=torch.version.cuda, nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl)
    return machine, versions


def run(config: dict, device: torch.device, env: RankEnv) -> dict | None:
    rank = dist.get_rank()
    cuda = device.type == "cuda"
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[config["dtype"]]
    min_time = config["min_time_s"]
    compute_items = len(config["gemm"]) + len(config["attention"]) + len(config["memory_bytes"]) + 1
    scopes = config["collective_groups"]
    total = (compute_items + len(scopes) * len(config["collective_ops"]) * len(config["collective_sizes"])
             + ("overlap" in config) + ("overlap_buckets" in config) + ("host_overhead_model" in config)
             + ("block_model" in config))
    bar = ProgressBar("profile", total, enabled=rank == 0)  # rank 0's: a bar on a terminal, else plain lines
    tick = bar.advance
    # The others wait for rank 0's compute benchmarks on a gloo group of their own with a long
    # timeout (``compute_wait_s``): the collective timeout (--timeout) is for the collectives.
    waiting = dist.new_group(backend="gloo", timeout=timedelta(seconds=config.get("compute_wait_s", 3600.0)))
    torch.manual_seed(0)
    raw = {"dtype": config["dtype"]}  # every rank measures at once; rank 0's are written
    raw["gemm"] = bench.gemm(config["gemm"], device, dtype, min_time, tick)
    raw["attention"] = bench.attention(config["attention"], device, dtype, min_time, tick)
    raw["memory"] = bench.memory(config["memory_bytes"], device, min_time, tick)
    raw["kernel_overhead_s"] = bench.kernel_overhead(device, min_time)
    tick("kernel launch")
    if "block_model" in config:
        from plait.spec.model import ModelSpec

        raw["block_s"] = runtime_cost.block_seconds(ModelSpec.from_dict(config["block_model"]), device,
                                                    config["host_overhead_tokens"], config["block_batches"])
        tick("a layer's forward and backward at two token counts")
    raw["host_link"] = bench.host_link(config["host_link_bytes"], device, min_time) if cuda else []
    raw["machine"], raw["versions"] = machine_and_versions(device, env)
    dist.barrier(group=waiting)
    groups = [(scope, lists) for scope, lists in scopes]
    raw["collectives"] = bench.collectives(config["collective_ops"], config["collective_sizes"], groups, device,
                                           min_time, tick)
    if "overlap" in config and dist.get_world_size() > 1:
        raw["overlap"] = runtime_cost.overlap(device, dtype, **config["overlap"])
        tick("overlap of compute and communication")
    if "overlap_buckets" in config and dist.get_world_size() > 1:
        raw["overlap_buckets"] = runtime_cost.overlap(device, dtype, **config["overlap_buckets"])
        tick("overlap of a gradient bucket behind longer compute")
    if "host_overhead_model" in config:
        from plait.spec.model import ModelSpec

        spec = ModelSpec.from_dict(config["host_overhead_model"])
        raw["layer_host_s"] = runtime_cost.layer_host_seconds(spec, device, config["host_overhead_tokens"],
                                                              config["host_overhead_layouts"], config["host_steps"],
                                                              config.get("host_rounds", 1))
        tick("runtime host time per layer")
    bar.close()
    return raw if rank == 0 else None


def main(argv: list[str] | None = None) -> None:
    from plait.run.device import rank_device
    from plait.run.worker import init_process_group, run_as_worker

    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0])

    def profile(env: RankEnv) -> None:
        config = json.loads((run_dir / "profile-config.json").read_text())
        device = rank_device(config["device"], env.local_rank)
        init_process_group(env, device, config["timeout_s"])
        raw = run(config, device, env)
        if raw is not None:
            (run_dir / "raw.json").write_text(json.dumps(raw))

    run_as_worker(run_dir, "profile", profile)


if __name__ == "__main__":
    main()
