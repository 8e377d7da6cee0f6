// Compute reservations of one tenant, newest first, filtered by state; pending ones show
// their conditions (why they wait). Refreshed whenever the event feed reports a change.

import { gql, gqlAll } from "./api.js";
import { esc, when } from "./format.js";

const QUERY = `query($tenantId: String, $state: String, $scope: String, $after: String) {
  computeReservations(tenantId: $tenantId, state: $state, scope: $scope, first: 100, after: $after) {
    pageInfo { hasNextPage endCursor }
    edges { node { id tenantId poolId state spot start end conditions reason createdAt
      placement { nodeId members { nodeId unitIds } } } } } }`;

/** The tenants offered each pool the key sees (the first 100 of each pool's). */
const TENANTS = `query($after: String) { pools(first: 100, after: $after) {
  pageInfo { hasNextPage endCursor } edges { node { offers(first: 100) { edges { node { tenantId } } } } } } }`;

const $ = (id) => document.getElementById(id);
let viewer = null;
let timer = null;
let shown = false;

export function setViewer(v) {
  viewer = v;
  $("res-tenant").value = v.orgId;
  tenantsListed = false;
}

let tenantsListed = false;

/** The tenants of the pools the key sees, offered in the tenant field; an operator starts on the first. */
async function listTenants() {
  if (tenantsListed) return;
  tenantsListed = true;
  let tenants = [];
  try {
    const { nodes: pools } = await gqlAll(TENANTS, "pools");
    tenants = [...new Set(pools.flatMap((p) => (p?.offers?.edges || []).map((e) => e.node.tenantId)))].sort();
  } catch {
    // Without offers to read, the field keeps the key's own org.
  }
  $("res-tenants").innerHTML = tenants.map((t) => `<option value="${esc(t)}"></option>`).join("");
  if (viewer?.ops && tenants.length && $("res-tenant").value === viewer.orgId) $("res-tenant").value = tenants[0];
}

export async function show() {
  shown = true;
  await listTenants();
  load();
}

export function hide() {
  shown = false;
}

export function onEvent() {
  if (!shown) return;
  clearTimeout(timer);
  timer = setTimeout(load, 300);
}

for (const id of ["res-state", "res-scope"]) $(id).addEventListener("change", () => load());
$("res-tenant").addEventListener("change", () => load());
$("res-filters").addEventListener("submit", (e) => { e.preventDefault(); load(); });

async function load() {
  const body = $("res-body");
  const variables = {
    tenantId: $("res-tenant").value.trim() || viewer?.orgId,
    state: $("res-state").value || null,
    scope: $("res-scope").value,
  };
  let data;
  try {
    ({ data } = await gql(QUERY, variables));
  } catch (e) {
    body.innerHTML = `<p class="error" role="alert">Reservations of ${esc(variables.tenantId)} cannot be shown: ${esc(e.message)}</p>`;
    return;
  }
  $("res-updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  const items = data.computeReservations.edges.map((e) => e.node);
  if (!items.length) {
    const which = variables.state ? `in state ${variables.state}` : "yet";
    body.innerHTML = `<div class="empty"><h2>No reservations ${esc(which)}</h2>
      <p>Reservations of ${esc(variables.tenantId)} appear here as they are created, without reloading.</p></div>`;
    return;
  }
  const more = data.computeReservations.pageInfo.hasNextPage ? `<p class="muted small">Showing the newest 100.</p>` : "";
  body.innerHTML = `<table class="grid" id="res-table"><caption class="sr-only">Compute reservations</caption>
    <thead><tr><th scope="col">Reservation</th><th scope="col">State</th><th scope="col">Pool</th>
    <th scope="col">Window</th><th scope="col">Where</th><th scope="col">Why</th></tr></thead>
    <tbody>${items.map(row).join("")}</tbody></table>${more}`;
}

function row(r) {
  const where = r.placement
    ? r.placement.members.map((m) => `${esc(m.nodeId)} <span class="muted">(${m.unitIds.length})</span>`).join(", ")
    : `<span class="muted">not placed</span>`;
  return `<tr data-id="${esc(r.id)}">
    <td><code>${esc(r.id)}</code>${r.spot ? ' <span class="tag spot">spot</span>' : ""}</td>
    <td><span class="state state-${esc(r.state)}">${esc(r.state)}</span></td>
    <td>${esc(r.poolId)}</td>
    <td>${esc(when(r.start))} → ${esc(when(r.end))}</td>
    <td>${where}</td>
    <td>${why(r)}</td></tr>`;
}

/** Why a reservation is where it is: its conditions' messages, or the reason it ended. */
function why(r) {
  const conditions = Array.isArray(r.conditions) ? r.conditions : [];
  const said = conditions
    .map((c) => `<span class="cond"><strong>${esc(c.type)}</strong> ${esc(c.reason)}: ${esc(c.message)}</span>`);
  if (r.reason) said.push(`<span class="cond"><strong>ended</strong> ${esc(r.reason)}</span>`);
  return said.join("<br>") || `<span class="muted">—</span>`;
}
