"""Spread placement: put a request on the node with the fewest busy units.

The same policy as the Rust example in ``examples/placer-spread``: the least busy node that
holds the request (then the lowest node id); within it, an ``nvlink_all`` entry takes the
NVLink domain with the most free matching units (then the lowest domain id), and every entry
takes the lowest unit ids it can. Entries are served ``nvlink_all`` first, largest first,
then those pinned to a model, then the rest.

Plain Python over the records of ``wit/policy.wit`` (any objects with the same attribute
names), so it runs and is tested without WebAssembly; ``app.py`` exports it as the
``placer`` world.
"""


class Unschedulable(Exception):
    """No candidate node holds the request; the message says what was asked for."""


def accepts(entry, unit):
    """Same class and, when the entry names one, same model."""
    return unit.class_ == entry.class_ and (entry.model is None or entry.model == unit.model)


def place(req, nodes):
    """Returns ``(node_id, unit_ids)``, ids entry by entry in request order, or raises
    ``Unschedulable``."""
    if all(entry.count == 0 for entry in req.devices):
        raise Unschedulable("the request asks for no devices")
    for node in sorted(nodes, key=lambda n: (n.busy_units, n.id)):
        units = place_on(req, node)
        if units is not None:
            return node.id, units
    raise Unschedulable("no node has room for " + describe(req))


def place_on(req, node):
    """The unit ids this policy gives ``req`` on ``node``, or ``None`` when it does not fit."""
    order = sorted(
        range(len(req.devices)),
        key=lambda i: (
            not req.devices[i].nvlink_all,
            -req.devices[i].count if req.devices[i].nvlink_all else 0,
            req.devices[i].model is None,
            i,
        ),
    )
    free = sorted(node.free, key=lambda u: u.id)
    taken = set()
    chosen = [[] for _ in req.devices]
    for i in order:
        entry = req.devices[i]
        if entry.count == 0:
            continue
        open_units = [u for u in free if u.id not in taken and accepts(entry, u)]
        if entry.nvlink_all:
            domains = sorted({u.nvlink_domain for u in open_units if u.nvlink_domain is not None})
            sizes = [(sum(1 for u in open_units if u.nvlink_domain == d), -d) for d in domains]
            if not sizes or max(sizes)[0] < entry.count:
                return None
            domain = -max(sizes)[1]
            open_units = [u for u in open_units if u.nvlink_domain == domain]
        if len(open_units) < entry.count:
            return None
        picked = open_units[: entry.count]
        taken.update(u.id for u in picked)
        chosen[i] = [u.id for u in picked]
    return [unit_id for entry_units in chosen for unit_id in entry_units]


def describe(req):
    """``8 gpu units of model H100 in one NVLink domain and 1 nic-vf unit``."""
    parts = []
    for entry in req.devices:
        if entry.count == 0:
            continue
        text = f"{entry.count} {class_name(entry.class_)} unit{'' if entry.count == 1 else 's'}"
        if entry.model is not None:
            name = req.models[entry.model] if entry.model < len(req.models) else f"#{entry.model}"
            text += f" of model {name}"
        if entry.nvlink_all:
            text += " in one NVLink domain"
        parts.append(text)
    return " and ".join(parts)


def class_name(device_class):
    """The WIT spelling of a device class given as a generated enum member or a string."""
    name = getattr(device_class, "name", device_class)
    return str(name).lower().replace("_", "-")
