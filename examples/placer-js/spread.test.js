// Unit tests of the spread policy and of the column reader, run without WebAssembly:
// `node --test`.

import assert from "node:assert/strict";
import { test } from "node:test";

import { nodesOf, place as placeComponent } from "./app.js";
import { Unschedulable, place } from "./spread.js";

const gpu = (id, domain = null, model = 0, cls = "gpu") => ({
  id,
  class: cls,
  model,
  nvlinkDomain: domain,
  memoryGib: 80,
});
const node = (id, busyUnits, free) => ({ id, busyUnits, totalUnits: 8, free });
const gpus = (count, nvlinkAll = false, model = 0) => ({
  devices: [{ class: "gpu", count, model, nvlinkAll }],
  spot: false,
  durationSeconds: 3600,
  models: ["H100"],
});

test("requests go to the least busy node", () => {
  const nodes = [node(1, 6, [gpu(0, 0), gpu(1, 0)]), node(2, 2, [gpu(2, 0), gpu(3, 0)])];
  assert.deepEqual(place(gpus(2), nodes), { node: 2, units: [2, 3] });
});

test("equally busy nodes go to the lowest id", () => {
  const nodes = [node(9, 1, [gpu(5)]), node(4, 1, [gpu(6)])];
  assert.deepEqual(place(gpus(1), nodes), { node: 4, units: [6] });
});

test("a less busy node without room is skipped", () => {
  const nodes = [node(1, 0, [gpu(0)]), node(2, 5, [gpu(1), gpu(2)])];
  assert.equal(place(gpus(2), nodes).node, 2);
});

test("nvlinkAll stays inside one domain", () => {
  const free = [gpu(0, 0), gpu(1, 1), gpu(2, 1), gpu(3, 0), gpu(4, 1)];
  assert.deepEqual(place(gpus(3, true), [node(1, 0, free)]).units, [1, 2, 4]);
  assert.throws(() => place(gpus(4, true), [node(1, 0, free)]), {
    name: "Error",
    message: "no node has room for 4 gpu units of model H100 in one NVLink domain",
  });
});

test("class and model are respected", () => {
  const nodes = [node(1, 0, [gpu(0, null, 1), gpu(1, null, 0, "nic-vf"), gpu(2)])];
  assert.deepEqual(place(gpus(1), nodes).units, [2]);
  assert.throws(() => place(gpus(2), nodes), Unschedulable);
});

test("units are listed entry by entry in request order", () => {
  const nodes = [node(1, 0, [gpu(0, 0), gpu(1, 0), gpu(7, null, 0, "nic-vf")])];
  const req = gpus(2, true);
  req.devices.unshift({ class: "nic-vf", count: 1, model: null, nvlinkAll: false });
  assert.deepEqual(place(req, nodes).units, [7, 0, 1]);
});

test("a request for nothing is refused", () => {
  assert.throws(() => place(gpus(0), [node(1, 0, [gpu(0)])]), /asks for no devices/);
});

// Two nodes as the host passes them: node 7 has units 0-1 (unit 1 a NIC VF), node 3 has
// units 2-3 in NVLink domain 0; node 3 is the busier one.
const columns = {
  nodes: {
    id: [7, 3],
    busyUnits: [1, 4],
    totalUnits: [8, 8],
    domainsStart: [0, 0],
    domainsLen: [0, 1],
    freeStart: [0, 2],
    freeLen: [2, 2],
  },
  units: {
    class: new Uint8Array([0, 3, 0, 0]),
    model: [0, 0, 0, 0],
    nvlinkDomain: [0xffffffff, 0xffffffff, 0, 0],
    memoryGib: [80, 0, 80, 80],
  },
  domains: { domain: [0], busy: [4], total: [8] },
};

test("the columns are read as rows", () => {
  const [first, second] = nodesOf(columns);
  assert.equal(first.id, 7);
  assert.deepEqual(
    first.free.map((u) => [u.id, u.class, u.nvlinkDomain]),
    [
      [0, "gpu", null],
      [1, "nic-vf", null],
    ],
  );
  assert.deepEqual(
    second.free.map((u) => u.id),
    [2, 3],
  );
});

test("the export places on the columns and refuses with a string", () => {
  assert.deepEqual(placeComponent(gpus(1), columns), { node: 7, units: [0] });
  assert.deepEqual(placeComponent(gpus(2, true), columns), { node: 3, units: [2, 3] });
  assert.throws(() => placeComponent(gpus(3), columns), (reason) => {
    assert.equal(reason, "no node has room for 3 gpu units of model H100");
    return true;
  });
});
