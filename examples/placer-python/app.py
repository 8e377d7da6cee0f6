"""The ``placer`` world export: runs ``spread.place`` on the generated WIT records."""

import wit_world
from componentize_py_types import Err
from wit_world.imports import types

import spread


class WitWorld(wit_world.WitWorld):
    def place(self, req: types.Request, nodes: list[types.Node]) -> types.Placement:
        try:
            node, units = spread.place(req, nodes)
        except spread.Unschedulable as unschedulable:
            raise Err(str(unschedulable))
        return types.Placement(node=node, units=units)
