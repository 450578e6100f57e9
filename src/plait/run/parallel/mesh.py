"""One DeviceMesh per run, the world mesh built from a Layout, every parallel dimension a named
axis of it or of a view of it, and the rank's place in them.

Axes (``MESH_DIMS``), each ``ParallelDims.group(name)``, ``.rank_in(name)``, ``.size(name)``:

  * ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp`` (``DENSE_DIMS``): the world mesh's own
    dimensions, outermost first in the reverse of ``Layout.order`` (whose innermost dimension comes
    first). Data parallelism is split in two so that every ZeRO stage is one of two shapes:
    zero=0 (DDP): ``dp_replicate = dp``, ``dp_shard = 1``; zero=1/2/3: ``dp_replicate = hsdp``,
    ``dp_shard = dp / hsdp`` (hsdp=1: plain FSDP).
  * ``edp``, ``ep`` (``EXPERT_DIMS``, built when ep > 1): the routed experts' view. The dp·cp ranks
    of each (pp, tp) position, flattened in the world mesh's order (``dp_cp``), are unflattened into
    edp × ep, ep innermost: expert parallelism carved out of data parallelism, as Megatron-Core
    and torchtitan do (``plait.run.parallel.expert``). With etp > 1 (etp = tp) the view is
    (edp, ep, etp) of the dp·cp·tp ranks, etp innermost, so that the expert weights split over ep
    and etp share the root mesh with edp (``plait.run.parallel.moe_tensor``).

Context parallelism: the cp ranks of a data-parallel replica hold the same weights and
different tokens, so data parallelism runs over dp×cp. With cp > 1 two flattened dimensions
are added: ``dp_shard_cp`` (FSDP shards over dp_shard×cp) and ``dp_replicate_cp`` (DDP, and
zero=0 replication, all-reduce over dp_replicate×cp).

Only ``build_parallel_dims`` constructs a DeviceMesh (``init_device_mesh``); the other groups are
views of it (``_flatten``/``_unflatten``, as torchtitan's ``ParallelDims.build_mesh`` makes its
dense and expert meshes from one world mesh), so they share its root and compose: FSDP2 shards the
ep-sharded experts over edp. Size-1 dimensions are kept, so code never asks whether a dense
dimension exists. Nothing here is global: the ``ParallelDims`` value is passed to whatever needs a
group.

A new parallel dimension is a name here, its size in ``mesh_shape`` (or a view in
``build_parallel_dims``), and its technique module in this folder reading ``pdims.group(name)``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from plait.errors import PlaitError
from plait.spec.layout import Layout

DENSE_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # the world mesh's dimensions
EXPERT_DIMS = ("edp", "ep")  # the routed experts' view of the dp·cp ranks (ep > 1)
MESH_DIMS = DENSE_DIMS + EXPERT_DIMS
_DATA_DIMS = ("dp_replicate", "dp_shard", "cp")  # the ranks that hold the same weights, different tokens


def mesh_shape(layout: Layout) -> dict[str, int]:
    """Size of every mesh dimension, keyed by name."""
    if layout.zero == 0:
        replicate, shard = layout.dp, 1
    else:
        if layout.dp % layout.hsdp:
            raise PlaitError(f"hsdp={layout.hsdp} does not divide dp={layout.dp}")
        replicate, shard = layout.hsdp, layout.dp // layout.hsdp
    return {"pp": layout.pp, "dp_replicate": replicate, "dp_shard": shard, "cp": layout.cp, "tp": layout.tp}


def mesh_dim_order(layout: Layout) -> tuple[str, ...]:
    """Mesh dimension names outermost first, following ``layout.order`` (innermost first)."""
    names: list[str] = []
    for dim in reversed(layout.order.split("-")):
        names.extend(("dp_replicate", "dp_shard") if dim == "dp" else (dim,))
    return tuple(names)


@dataclass(frozen=True)
class ParallelDims:
    """The run's world mesh, its expert view, and this rank's coordinates in them."""

    layout: Layout
    mesh: DeviceMesh  # the world mesh: DENSE_DIMS (and the flattened dp·cp dimensions)
    expert_mesh: DeviceMesh | None = None  # (edp, ep), a view of ``mesh``; None when ep = 1

    def _holder(self, name: str) -> DeviceMesh:
        if name not in EXPERT_DIMS:
            return self.mesh
        if self.expert_mesh is None:
            raise ValueError(f"the {name} axis is built only with ep > 1 (layout {self.layout})")
        return self.expert_mesh

    # Looked up by dimension name on the full mesh: slicing (``mesh[name]``) builds a new
    # DeviceMesh each time, which the training step would pay for on every step.
    def group(self, name: str) -> dist.ProcessGroup:
        return self._holder(name).get_group(name)

    def rank_in(self, name: str) -> int:
        return self._holder(name).get_local_rank(name)

    def size(self, name: str) -> int:
        if name in EXPERT_DIMS and self.expert_mesh is None:
            return 1 if name == "ep" else self.layout.dp * self.layout.cp
        holder = self._holder(name)
        return holder.shape[holder.mesh_dim_names.index(name)]

    def axis(self, name: str) -> DeviceMesh:
        """The 1-D mesh of axis ``name`` through this rank (for DTensor placements and FSDP2)."""
        return self._holder(name)[name]

    @property
    def dp_rank(self) -> int:
        """Index of this rank's share of the global batch (0 .. dp-1)."""
        return self.rank_in("dp_replicate") * self.size("dp_shard") + self.rank_in("dp_shard")

    @property
    def dp_mesh(self) -> DeviceMesh:
        """2-D (replicate, shard) mesh that FSDP2 replicates and shards over.

        (dp_replicate, dp_shard) without context parallelism; with cp > 1 the cp ranks join the
        shards (dp_shard_cp) or, for zero=0 replication, the replicas (dp_replicate_cp).
        """
        if self.layout.cp == 1:
            return self.mesh["dp_replicate", "dp_shard"]
        with warnings.catch_warnings():  # torch >= 2.13 warns on slicing flattened dims; 2.11 needs it
            warnings.filterwarnings("ignore", message="Slicing a flattened dim")
            if self.layout.zero == 0:
                return self.mesh["dp_replicate_cp", "dp_shard"]
            return self.mesh["dp_replicate", "dp_shard_cp"]

    @property
    def replicate_group(self) -> dist.ProcessGroup:
        """Where DDP all-reduces gradients: the dp_replicate ranks, and with cp > 1 their cp ranks too."""
        return self.group("dp_replicate_cp" if self.layout.cp > 1 else "dp_replicate")

    @property
    def grad_sync_size(self) -> int:
        """Ranks whose gradients are averaged: dp·cp (each holds a different share of the tokens)."""
        return self.layout.dp * self.layout.cp

    @property
    def pp_rank(self) -> int:
        return self.rank_in("pp")

    @property
    def is_last_stage_rank(self) -> bool:
        return self.pp_rank == self.layout.pp - 1

    @property
    def loss_owner(self) -> bool:
        """Which ranks report their loss: the last stage's tp rank 0 of every (dp, cp) rank pair;
        each reports the mean over an equal share (1/(dp·cp)) of the global batch's tokens."""
        return self.is_last_stage_rank and self.rank_in("tp") == 0


def build_parallel_dims(layout: Layout, device_type: str) -> ParallelDims:
    """Build the mesh of ``layout`` over the initialized default process group."""
    world = dist.get_world_size()
    if layout.world_size != world:
        raise PlaitError(f"layout {layout} needs dp·tp·pp·cp = {layout.world_size} processes "
                         f"but {world} were launched; change --nproc-per-node/--nnodes or the layout")
    shape = mesh_shape(layout)
    names = mesh_dim_order(layout)
    mesh = init_device_mesh(device_type, tuple(shape[n] for n in names), mesh_dim_names=names)
    if layout.cp > 1:
        for dp_dim in ("dp_shard", "dp_replicate"):
            pair = tuple(sorted((dp_dim, "cp"), key=names.index))  # a slice keeps the mesh's order
            mesh[pair]._flatten(f"{dp_dim}_cp")
    experts = expert_view(mesh, layout) if layout.ep > 1 else None
    return ParallelDims(layout=layout, mesh=mesh, expert_mesh=experts)


def expert_view(mesh: DeviceMesh, layout: Layout) -> DeviceMesh:
    """The (edp, ep) view of the world ``mesh``: its dp·cp ranks flattened in the mesh's order
    (``dp_cp``), then unflattened into edp = dp·cp/ep × ep, ep innermost."""
    data_parallel = layout.dp * layout.cp
    if data_parallel % layout.ep:
        raise PlaitError(f"ep={layout.ep} does not divide dp·cp = {data_parallel}: the runtime carves "
                         "expert parallelism out of the data-parallel ranks")
    if not hasattr(DeviceMesh, "_unflatten"):  # a private API (torch 2.11 and 2.13 have it)
        raise PlaitError(f"ep={layout.ep} needs a torch whose DeviceMesh has _unflatten (2.11 or newer); "
                         f"this is torch {torch.__version__}")
    dims = tuple(name for name in mesh.mesh_dim_names if name in _DATA_DIMS)  # a slice keeps the mesh's order
    if layout.etp > 1:  # (edp, ep, etp): etp the tp ranks, innermost (Megatron-Core's expert mesh)
        names = mesh.mesh_dim_names
        if names.index("tp") < max(names.index(name) for name in dims):
            raise PlaitError(f"etp={layout.etp} with ep={layout.ep} needs tp inside dp and cp in the rank order "
                             f"(order={layout.order}); use the default order tp-cp-dp-pp")
        flat = mesh[dims + ("tp",)]._flatten("dp_cp_tp")
        return flat._unflatten(0, (data_parallel // layout.ep, layout.ep, layout.etp), EXPERT_DIMS + ("etp",))
    flat = mesh[dims]._flatten("dp_cp")
    return flat._unflatten(0, (data_parallel // layout.ep, layout.ep), EXPERT_DIMS)
