"""The device mesh of a plan: axes `pp, dp_replicate, dp_shard, cp, tp` (torchtitan's order).

`build_mesh` lays ranks out in `plan.rank_placement` order (outermost first; tp innermost by
default, so a TP group is consecutive ranks) and names the axes canonically, so the rest of the
executor slices `mesh["tp"]`, `mesh["pp"]`, ... whatever the placement. `ParallelDims` answers the
questions the apply_* steps ask: which data-parallel replica am I, which pipeline rank, which
process group reduces my gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.distributed.device_mesh import DeviceMesh

from meshplan.errors import MeshplanError
from meshplan.plan import MESH_AXES, Plan

_MESH_CACHE: dict[tuple, DeviceMesh] = {}


def placement_axes(plan: Plan) -> list[str]:
    """The mesh axes in rank-placement order (outermost first); MeshplanError if malformed."""
    axes = [a.strip() for a in plan.rank_placement.split(",")]
    if sorted(axes) != sorted(MESH_AXES):
        raise MeshplanError(
            f"plan.rank_placement = {plan.rank_placement!r}: must order all of {','.join(MESH_AXES)} exactly once"
        )
    return axes


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """A 5-D DeviceMesh over all ranks, cached per (shape, placement, device) within a process."""
    key = (plan.mesh_shape, plan.rank_placement, device_type)
    if key not in _MESH_CACHE:
        axes = placement_axes(plan)
        degree = dict(zip(MESH_AXES, plan.mesh_shape))
        ranks = torch.arange(plan.world_size).reshape([degree[a] for a in axes])  # placement order
        ranks = ranks.permute([axes.index(a) for a in MESH_AXES])  # canonical order
        _MESH_CACHE[key] = DeviceMesh(device_type, ranks.contiguous(), mesh_dim_names=MESH_AXES)
    return _MESH_CACHE[key]


@dataclass(kw_only=True)
class ParallelDims:
    """This rank's coordinates in the plan's mesh and the sub-meshes each apply_* step uses.

    Sizes, coordinates and the pp group are computed once: slicing a DeviceMesh costs about
    2 ms on CPU, far too much to repeat every training step."""

    plan: Plan
    mesh: DeviceMesh
    sizes: dict[str, int] = field(init=False)
    coords: dict[str, int] = field(init=False)
    pp_group: object = field(init=False)

    def __post_init__(self):
        self.sizes = {a: self.mesh[a].size() for a in MESH_AXES}
        self.coords = {a: self.mesh[a].get_local_rank() for a in MESH_AXES}
        self.pp_group = self.mesh["pp"].get_group()
        self._dp_mesh = self._fsdp_mesh = None

    def size(self, axis: str) -> int:
        return self.sizes[axis]

    def local_rank(self, axis: str) -> int:
        return self.coords[axis]

    @property
    def pp_rank(self) -> int:
        return self.coords["pp"]

    @property
    def dp_degree(self) -> int:
        return self.sizes["dp_replicate"] * self.sizes["dp_shard"]

    @property
    def dp_rank(self) -> int:
        """Index of this rank's data-parallel replica (which slice of the global batch it reads)."""
        return self.coords["dp_replicate"] * self.sizes["dp_shard"] + self.coords["dp_shard"]

    def dp_mesh(self) -> DeviceMesh:
        """1-D mesh over all data-parallel ranks (DDP / ZeRO-1 reduce gradients over it)."""
        if self._dp_mesh is None:
            if self.sizes["dp_shard"] == 1:
                self._dp_mesh = self.mesh["dp_replicate"]
            elif self.sizes["dp_replicate"] == 1:
                self._dp_mesh = self.mesh["dp_shard"]
            else:
                self._dp_mesh = self.mesh["dp_replicate", "dp_shard"]._flatten("dp")
        return self._dp_mesh

    def fsdp_mesh(self) -> DeviceMesh:
        """FSDP2 mesh: 1-D over dp_shard, or 2-D (dp_replicate, dp_shard) for HSDP."""
        if self._fsdp_mesh is None:
            both = self.sizes["dp_replicate"] > 1
            self._fsdp_mesh = self.mesh["dp_replicate", "dp_shard"] if both else self.mesh["dp_shard"]
        return self._fsdp_mesh

    @property
    def is_loss_owner(self) -> bool:
        """Ranks whose loss counts once per replica: last pipeline rank, first tp and cp rank."""
        return self.coords["pp"] == self.sizes["pp"] - 1 and self.coords["tp"] == 0 and self.coords["cp"] == 0
