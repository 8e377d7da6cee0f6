"""The ``placer`` world export: runs ``spread.place`` on the generated WIT records."""

from types import SimpleNamespace

import wit_world
from componentize_py_types import Err
from wit_world.imports import types

import spread


NO_DOMAIN = 0xFFFFFFFF


def nodes_of(candidates: types.Candidates) -> list[SimpleNamespace]:
    """Each candidate node with its free units gathered from the candidate columns; a unit's
    id is its position in the columns."""
    units = candidates.units

    def unit(i: int) -> SimpleNamespace:
        domain = units.nvlink_domain[i]
        return SimpleNamespace(
            id=i,
            # `units.class` carries each class as the position of its case in the enum.
            class_=types.DeviceClass(units.class_[i]),
            model=units.model[i],
            nvlink_domain=None if domain == NO_DOMAIN else domain,
            memory_gib=units.memory_gib[i],
        )

    nodes = candidates.nodes
    return [
        SimpleNamespace(
            id=nodes.id[j],
            busy_units=nodes.busy_units[j],
            total_units=nodes.total_units[j],
            free=[unit(i) for i in range(nodes.free_start[j], nodes.free_start[j] + nodes.free_len[j])],
        )
        for j in range(len(nodes.id))
    ]


class WitWorld(wit_world.WitWorld):
    def place(self, req: types.Request, candidates: types.Candidates) -> types.Placement:
        try:
            node, units = spread.place(req, nodes_of(candidates))
        except spread.Unschedulable as unschedulable:
            raise Err(str(unschedulable))
        return types.Placement(node=node, units=units)
