// The `placer` world export: runs `spread.place` on rows read from the candidate columns of
// `wit/policy.wit`. Records arrive as objects with camelCase fields, enums as their WIT case
// names, `option` as a value or `null`; throwing a string answers `err(reason)`.

import { place as spread, Unschedulable } from "./spread.js";

/** A unit that is in no NVLink domain (`u32::MAX`). */
const NO_DOMAIN = 0xffffffff;

/** The WIT `device-class` cases, by the code `units.class` carries. */
const CLASSES = ["gpu", "gpu-mig", "gpu-slot", "nic-vf", "disk", "node"];

/** Each candidate node with its free units as rows; a unit's id is its position. */
export function nodesOf(candidates) {
  const { nodes, units } = candidates;
  const unit = (i) => ({
    id: i,
    class: CLASSES[units.class[i]] ?? null,
    model: units.model[i],
    nvlinkDomain: units.nvlinkDomain[i] === NO_DOMAIN ? null : units.nvlinkDomain[i],
    memoryGib: units.memoryGib[i],
  });
  const rows = [];
  for (let j = 0; j < nodes.id.length; j++) {
    const free = [];
    for (let i = nodes.freeStart[j]; i < nodes.freeStart[j] + nodes.freeLen[j]; i++) {
      free.push(unit(i));
    }
    rows.push({
      id: nodes.id[j],
      busyUnits: nodes.busyUnits[j],
      totalUnits: nodes.totalUnits[j],
      free,
    });
  }
  return rows;
}

/** `place` of the `placer` world. */
export function place(req, candidates) {
  try {
    return spread(req, nodesOf(candidates));
  } catch (error) {
    if (error instanceof Unschedulable) {
      throw error.message;
    }
    throw error;
  }
}
