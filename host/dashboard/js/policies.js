// Per pool: which plugin decides placement, preemption and spend limits, with its
// decision and failure counts. Plugin names come from the plugin list when the key may
// read it; otherwise the plugin's content hash is shown.

import { describe, gqlAll } from "./api.js";
import { esc } from "./format.js";

const QUERY = `query($after: String) { pools(first: 100, after: $after) {
  pageInfo { hasNextPage endCursor }
  edges { node { id name archived
    policies { onPolicyFailure deadlineMs }
    deciders { kind world pluginId builtIn decisionCount failureCount } } } } }`;
const PLUGINS = `query($after: String) { plugins(first: 500, after: $after) {
  pageInfo { hasNextPage endCursor }
  edges { node { id name version } } } }`;

const body = () => document.getElementById("policies-body");
let timer = null;

export function show() {
  load();
}

export function onEvent() {
  clearTimeout(timer);
  timer = setTimeout(load, 1000);
}

async function load() {
  let pools;
  let errors;
  try {
    ({ nodes: pools, errors } = await gqlAll(QUERY, "pools"));
  } catch (e) {
    body().innerHTML = `<p class="error" role="alert">Policies cannot be shown: ${esc(e.message)}</p>`;
    return;
  }
  const names = new Map();
  try {
    const { nodes: plugins } = await gqlAll(PLUGINS, "plugins");
    for (const p of plugins) names.set(p.id, `${p.name} ${p.version}`);
  } catch {
    // A key that may not read plugins sees their content hashes.
  }
  if (!pools.length) {
    body().innerHTML = `<div class="empty"><h2>No pools to show</h2><p>This key sees no pool.</p></div>`;
    return;
  }
  const refused = new Map(errors.filter((e) => e.node).map((e) => [e.node.id, describe(e)]));
  body().innerHTML = `<table class="grid" id="policies-table"><caption class="sr-only">Policy plugins per pool</caption>
    <thead><tr><th scope="col">Pool</th><th scope="col">Policy</th><th scope="col">Plugin</th>
      <th scope="col" class="num">Decisions</th><th scope="col" class="num">Failures</th><th scope="col">On failure</th></tr></thead>
    <tbody>${pools.map((p) => poolRows(p, refused.get(p.id), names)).join("")}</tbody></table>`;
}

function poolRows(pool, refusal, names) {
  const head = `<th scope="rowgroup" rowspan="${pool.deciders ? pool.deciders.length : 1}">${esc(pool.name)}<br><span class="muted small">${esc(pool.id)}${pool.archived ? " · archived" : ""}</span></th>`;
  if (!pool.deciders) {
    return `<tr>${head}<td colspan="5" class="muted">${esc(refusal || "Not visible to this key.")}</td></tr>`;
  }
  return pool.deciders.map((d, i) => {
    const plugin = d.builtIn
      ? `built-in default <span class="muted small">${esc(d.world)}</span>`
      : `${esc(names.get(d.pluginId) || d.pluginId.slice(0, 19) + "…")}`;
    const failures = d.failureCount > 0 ? `<span class="bad">${d.failureCount}</span>` : "0";
    const failure = i === 0 ? `<td rowspan="${pool.deciders.length}">${esc(pool.policies?.onPolicyFailure || "fail")}${pool.policies?.deadlineMs ? `<br><span class="muted small">deadline ${pool.policies.deadlineMs} ms</span>` : ""}</td>` : "";
    return `<tr>${i === 0 ? head : ""}<td>${esc(d.kind)}</td><td title="${esc(d.pluginId)}">${plugin}</td>
      <td class="num">${d.decisionCount}</td><td class="num">${failures}</td>${failure}</tr>`;
  }).join("");
}
