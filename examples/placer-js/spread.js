// Spread placement: put a request on the node with the fewest busy units.
//
// The same policy as the Rust example in `examples/placer-spread`: the least busy node that
// holds the request (then the lowest node id); within it, an `nvlinkAll` entry takes the
// NVLink domain with the most free matching units (then the lowest domain id), and every
// entry takes the lowest unit ids it can. Entries are served `nvlinkAll` first, largest
// first, then those pinned to a model, then the rest.
//
// Plain JavaScript over node and unit rows, so it runs and is tested under Node.js without
// WebAssembly (`node --test`); `app.js` exports it as the `placer` world.

/** Thrown when no candidate node holds the request; the message says what was asked for. */
export class Unschedulable extends Error {}

/** Same class and, when the entry names one, same model. */
export function accepts(entry, unit) {
  return unit.class === entry.class && (entry.model == null || entry.model === unit.model);
}

/**
 * Places `req` on the least busy of `nodes` that holds it: returns `{ node, units }`, the
 * unit ids entry by entry in request order, or throws `Unschedulable`.
 */
export function place(req, nodes) {
  if (req.devices.every((entry) => entry.count === 0)) {
    throw new Unschedulable("the request asks for no devices");
  }
  const byLoad = [...nodes].sort((a, b) => a.busyUnits - b.busyUnits || a.id - b.id);
  for (const node of byLoad) {
    const units = placeOn(req, node);
    if (units !== null) {
      return { node: node.id, units };
    }
  }
  throw new Unschedulable(`no node has room for ${describe(req)}`);
}

/** The unit ids this policy gives `req` on `node`, or `null` when it does not fit. */
export function placeOn(req, node) {
  const key = (i) => {
    const entry = req.devices[i];
    return [
      entry.nvlinkAll ? 0 : 1,
      entry.nvlinkAll ? -entry.count : 0,
      entry.model == null ? 1 : 0,
      i,
    ];
  };
  const order = req.devices.map((_, i) => i).sort((a, b) => compare(key(a), key(b)));
  const free = [...node.free].sort((a, b) => a.id - b.id);
  const taken = new Set();
  const chosen = req.devices.map(() => []);
  for (const i of order) {
    const entry = req.devices[i];
    if (entry.count === 0) {
      continue;
    }
    let open = free.filter((u) => !taken.has(u.id) && accepts(entry, u));
    if (entry.nvlinkAll) {
      const domain = roomiestDomain(open);
      if (domain === null || domain.count < entry.count) {
        return null;
      }
      open = open.filter((u) => u.nvlinkDomain === domain.id);
    }
    if (open.length < entry.count) {
      return null;
    }
    const picked = open.slice(0, entry.count);
    for (const u of picked) {
      taken.add(u.id);
    }
    chosen[i] = picked.map((u) => u.id);
  }
  return chosen.flat();
}

/** The domain holding the most of `units`, then the lowest id: `{ id, count }`, or `null`. */
function roomiestDomain(units) {
  const counts = new Map();
  for (const u of units) {
    if (u.nvlinkDomain != null) {
      counts.set(u.nvlinkDomain, (counts.get(u.nvlinkDomain) ?? 0) + 1);
    }
  }
  let best = null;
  for (const [id, count] of counts) {
    if (best === null || count > best.count || (count === best.count && id < best.id)) {
      best = { id, count };
    }
  }
  return best;
}

/** `8 gpu units of model H100 in one NVLink domain and 1 nic-vf unit`. */
export function describe(req) {
  return req.devices
    .filter((entry) => entry.count > 0)
    .map((entry) => {
      let text = `${entry.count} ${entry.class} unit${entry.count === 1 ? "" : "s"}`;
      if (entry.model != null) {
        text += ` of model ${req.models[entry.model] ?? `#${entry.model}`}`;
      }
      if (entry.nvlinkAll) {
        text += " in one NVLink domain";
      }
      return text;
    })
    .join(" and ");
}

function compare(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) {
      return a[i] - b[i];
    }
  }
  return 0;
}
