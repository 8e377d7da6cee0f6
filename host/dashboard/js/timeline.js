// The timeline view: picks a pool, model and node filter, reads one page of nodes from
// `timeline` (24 hours back to 7 days ahead), turns them into rows for the canvas, and
// draws the legend. Events from the live feed reload the page in view.

import { gql } from "./api.js";
import { DAY, STATE_COLOURS, esc, tenantColour, when } from "./format.js";
import { TimelineCanvas, describeHit } from "./timeline-canvas.js";

const POOLS = `{ capacity { poolId poolName models { model } } }`;
const PAGE = `query($pool: String!, $model: String, $node: String, $first: Int, $after: String) {
  timeline(poolId: $pool, model: $model, node: $node, first: $first, after: $after) {
    totalCount from to now pageInfo { hasNextPage endCursor }
    edges { node { nodeId lost needsReview
      units { id model deviceClass nvlinkDomain }
      bookings { unitId reservationId tenantId state start end spot active gang }
      terms { id unitIds releasedUnitIds allowedOrgIds startsAt endsAt status } } } } }`;

const $ = (id) => document.getElementById(id);
let canvas = null;
let pools = [];
let cursors = [null];
let page = 0;
let timer = null;
let shown = false;
let loading = 0;

export function show() {
  shown = true;
  if (!canvas) {
    canvas = new TimelineCanvas({
      scroll: $("tl-scroll"),
      spacer: $("tl-spacer"),
      canvas: $("tl-canvas"),
      tip: $("tl-tip"),
      onPick: pick,
    });
    bindControls();
  }
  loadPools();
}

export function hide() {
  shown = false;
}

export function onEvent() {
  if (!shown) return;
  clearTimeout(timer);
  timer = setTimeout(() => loadPage(), 400);
}

function message(text, kind = "info") {
  const el = $("tl-message");
  el.hidden = !text;
  el.className = `message ${kind}`;
  el.innerHTML = text || "";
}

async function loadPools() {
  try {
    ({ data: { capacity: pools } } = await gql(POOLS));
  } catch (e) {
    message(`The pools cannot be listed: ${esc(e.message)}`, "error");
    return;
  }
  const select = $("tl-pool");
  const chosen = select.value;
  select.innerHTML = pools.map((p) => `<option value="${esc(p.poolId)}">${esc(p.poolName)} (${esc(p.poolId)})</option>`).join("");
  if (!pools.length) {
    message("This key sees no pool, so there is nothing to draw. Pools appear here once the key's org owns one or is offered one.");
    canvas.setData([], [Date.now() - DAY, Date.now() + 7 * DAY], Date.now());
    return;
  }
  if (pools.some((p) => p.poolId === chosen)) select.value = chosen;
  fillModels();
  restart();
}

function fillModels() {
  const pool = pools.find((p) => p.poolId === $("tl-pool").value);
  const select = $("tl-model");
  const chosen = select.value;
  select.innerHTML = `<option value="">All models</option>` +
    (pool?.models || []).map((m) => `<option>${esc(m.model)}</option>`).join("");
  if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
}

function restart() {
  cursors = [null];
  page = 0;
  loadPage();
}

async function loadPage() {
  const pool = $("tl-pool").value;
  if (!pool) return;
  const first = Number($("tl-size").value);
  const variables = {
    pool, first,
    model: $("tl-model").value || null,
    node: $("tl-node").value.trim() || null,
    after: cursors[page],
  };
  const ticket = ++loading;
  let data;
  try {
    ({ data } = await gql(PAGE, variables));
  } catch (e) {
    if (ticket === loading) message(`The timeline cannot be shown: ${esc(e.message)}`, "error");
    return;
  }
  if (ticket !== loading) return;
  const t = data.timeline;
  cursors[page + 1] = t.pageInfo.endCursor;
  const nodes = t.edges.map((e) => e.node);
  const start = page * first;
  $("tl-range").textContent = t.totalCount
    ? `nodes ${start + 1}–${start + nodes.length} of ${t.totalCount}`
    : "no nodes";
  $("tl-prev").disabled = page === 0;
  $("tl-next").disabled = !t.pageInfo.hasNextPage;
  if (!nodes.length) {
    message(variables.model || variables.node
      ? "No node of this pool matches the filters."
      : "This pool has no nodes yet: add nodes to it and they appear here.");
  } else {
    message(nodes.every((n) => !n.bookings.length) ? "No bookings on these nodes between 24 hours ago and 7 days ahead." : "");
  }
  const rows = toRows(nodes);
  // The window and "now" are the server's: its clock decides what is past and what is ahead.
  canvas.setData(rows, [t.from, t.to], t.now);
  legend(nodes);
  list(nodes);
}

/** The page's bookings as a table: one line per reservation and node, for keyboards and screen readers. */
function list(nodes) {
  const lines = [];
  for (const n of nodes) {
    const byHolder = new Map();
    for (const b of n.bookings) {
      const key = `${b.reservationId ?? "hidden"}|${b.start}|${b.end}`;
      if (!byHolder.has(key)) byHolder.set(key, { ...b, units: 0 });
      byHolder.get(key).units++;
    }
    for (const b of byHolder.values()) lines.push({ node: n.nodeId, ...b });
  }
  const body = document.querySelector("#tl-bookings tbody");
  body.innerHTML = lines.length
    ? lines.map((b) => `<tr data-reservation="${esc(b.reservationId ?? "")}"><td>${b.reservationId ? `<code>${esc(b.reservationId)}</code>` : '<span class="muted">hidden from this key</span>'}</td>
        <td>${esc(b.tenantId ?? "—")}</td><td>${esc(b.node)}</td><td class="num">${b.units}</td>
        <td>${esc(when(b.start))}</td><td>${esc(when(b.end))}</td>
        <td>${[b.spot ? "spot" : "on demand", b.gang ? "gang" : "", b.active ? "" : "released early"].filter(Boolean).join(", ")}</td></tr>`).join("")
    : `<tr><td colspan="7" class="muted">No bookings on these nodes in the window.</td></tr>`;
}

/** Node header rows and unit rows, units grouped by NVLink domain. */
function toRows(nodes) {
  const rows = [];
  for (const n of nodes) {
    const node = { kind: "node", nodeId: n.nodeId, lost: n.lost, needsReview: n.needsReview, unitCount: n.units.length };
    rows.push(node);
    const units = [...n.units].sort((a, b) => (a.nvlinkDomain || "~").localeCompare(b.nvlinkDomain || "~") || a.id.localeCompare(b.id, undefined, { numeric: true }));
    units.forEach((unit, i) => {
      const domain = unit.nvlinkDomain;
      const bands = n.terms
        .filter((t) => t.unitIds.includes(unit.id))
        .map((t) => ({ ...t, released: t.releasedUnitIds.includes(unit.id) }));
      rows.push({
        kind: "unit",
        node,
        unit,
        domain,
        firstInDomain: i === 0 || units[i - 1].nvlinkDomain !== domain,
        lastInDomain: i === units.length - 1 || units[i + 1].nvlinkDomain !== domain,
        bars: n.bookings.filter((b) => b.unitId === unit.id).sort((a, b) => a.start - b.start),
        bands,
      });
    });
  }
  return rows;
}

function legend(nodes) {
  const tenants = [...new Set(nodes.flatMap((n) => n.bookings.map((b) => b.tenantId)))];
  const named = tenants.filter(Boolean).sort();
  const items = named.map((t) => `<span class="item"><span class="swatch" style="background:${tenantColour(t)}"></span>${esc(t)}</span>`);
  if (tenants.includes(null)) items.push(`<span class="item"><span class="swatch" style="background:${tenantColour(null)}"></span>booked by an org hidden from this key</span>`);
  items.push(
    `<span class="item"><span class="swatch spot"></span>spot</span>`,
    `<span class="item"><span class="swatch faded"></span>released early</span>`,
    `<span class="item"><span class="swatch term"></span>node reservation term</span>`,
    `<span class="item"><span class="swatch released"></span>unit released to spot</span>`,
    `<span class="item"><span class="swatch review"></span>needs review</span>`,
    `<span class="item"><span class="swatch" style="background:${STATE_COLOURS.lost}"></span>lost node</span>`,
    `<span class="item"><span class="line-now"></span>now</span>`,
    `<span class="item muted">Hover a bar to link a gang's members; click for details. Ctrl+wheel zooms, Shift+wheel or drag pans.</span>`,
  );
  $("tl-legend").innerHTML = items.join("");
}

function pick(hit) {
  const panel = $("tl-detail");
  if (!hit) {
    panel.hidden = true;
    return;
  }
  panel.innerHTML = `<button type="button" class="ghost close" aria-label="Close details">×</button>${describeHit(hit)}`;
  panel.hidden = false;
  panel.querySelector(".close").addEventListener("click", () => { panel.hidden = true; $("tl-canvas").focus(); });
}

function bindControls() {
  $("tl-pool").addEventListener("change", () => { fillModels(); restart(); });
  $("tl-model").addEventListener("change", restart);
  $("tl-size").addEventListener("change", restart);
  let typing = null;
  $("tl-node").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(restart, 300); });
  $("timeline-filters").addEventListener("submit", (e) => { e.preventDefault(); restart(); });
  $("tl-prev").addEventListener("click", () => { if (page > 0) { page--; loadPage(); } });
  $("tl-next").addEventListener("click", () => { page++; loadPage(); });
  $("tl-zoom-in").addEventListener("click", () => canvas.zoom(0.66));
  $("tl-zoom-out").addEventListener("click", () => canvas.zoom(1.5));
  $("tl-now").addEventListener("click", () => canvas.centreOnNow());
  $("tl-reset").addEventListener("click", () => canvas.setView(...canvas.window));
}
