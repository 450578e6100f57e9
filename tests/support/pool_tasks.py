"""Tiny module-level task bodies for DistPool's own tests (tests/support/test_distpool.py)."""

import os
import time

import torch
import torch.distributed as dist


def allreduce_sum(scale=1.0, *, offset=0.0):
    """all_reduce(SUM) of (rank + 1) * scale + offset; returns what each rank saw."""
    t = torch.tensor([(dist.get_rank() + 1) * scale + offset])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
            "threads": torch.get_num_threads(), "pid": os.getpid()}


def gather_tensor():
    """Returns a CPU tensor (pickled back to the parent) holding every rank's id."""
    out = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor([float(dist.get_rank())]))
    return torch.cat(out)


def raise_on_rank(bad_rank=1):
    """``bad_rank`` raises; the others wait in a barrier that never completes (until the pool is killed)."""
    if dist.get_rank() == bad_rank:
        raise ValueError(f"boom from rank {bad_rank}")
    dist.barrier()


def hang_on_rank(stuck_rank=0):
    """``stuck_rank`` sleeps forever; the others return at once."""
    if dist.get_rank() == stuck_rank:
        time.sleep(3600)
    return dist.get_rank()


def exit_on_rank(dead_rank=1):
    """``dead_rank`` exits without a reply (as a segfault or OOM kill would)."""
    if dist.get_rank() == dead_rank:
        os._exit(7)
    return dist.get_rank()


def unpicklable_result():
    """A result that cannot be sent back."""
    return lambda: None


def warn_plan_key():
    """Emits the unresolved-TP-plan warning, which the workers turn into an error like the parent does."""
    import warnings

    warnings.warn("Parallelize plan key 'x' could not be resolved", UserWarning)
    return "not reached"


def worker_state():
    """This rank's native thread count (Linux: /proc/self/task) and how many process groups it holds."""
    from torch.distributed import distributed_c10d as c10d

    return {"threads": len(os.listdir("/proc/self/task")), "groups": len(c10d._world.pg_names)}


def build_groups():
    """Builds a 2-D (dp, tp) DeviceMesh with a flattened dimension, new_subgroups and a plain new_group,
    uses each, and runs a DTensor matmul and redistribute over the mesh; returns the rank's state before
    and while the groups exist and the DTensor results (a later run must get the same ones)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    before = worker_state()
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    flat = mesh["dp", "tp"]._flatten("dp_tp")
    groups = [mesh["dp"].get_group(), mesh["tp"].get_group(), flat.get_group(),
              dist.new_subgroups(2)[0], dist.new_group(list(range(dist.get_world_size())))]
    sums = []
    for group in groups:
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        sums.append(t.item())
    g = torch.Generator().manual_seed(0)
    a = distribute_tensor(torch.randn(8, 8, generator=g), mesh, [Replicate(), Shard(0)])
    b = distribute_tensor(torch.randn(8, 8, generator=g), mesh, [Replicate(), Shard(1)])
    product = (a @ b).redistribute(mesh, [Replicate(), Replicate()]).to_local()
    return {"before": before, "during": worker_state(), "sums": sums, "product": product}
