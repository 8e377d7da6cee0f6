"""The ``placer`` world export: runs ``spread.place`` on the generated WIT records."""

from types import SimpleNamespace

import wit_world
from componentize_py_types import Err
from wit_world.imports import types

import spread


def nodes_of(candidates: types.Candidates) -> list[SimpleNamespace]:
    """Each candidate node with its free units resolved from the flat ``candidates.units``."""
    return [
        SimpleNamespace(
            id=n.id,
            busy_units=n.busy_units,
            total_units=n.total_units,
            free=candidates.units[n.free.start : n.free.start + n.free.len],
        )
        for n in candidates.nodes
    ]


class WitWorld(wit_world.WitWorld):
    def place(self, req: types.Request, candidates: types.Candidates) -> types.Placement:
        try:
            node, units = spread.place(req, nodes_of(candidates))
        except spread.Unschedulable as unschedulable:
            raise Err(str(unschedulable))
        return types.Placement(node=node, units=units)
