// Capacity overview: per pool and model, units by state now, a 7-day forecast of what is
// booked and reserved so far, and the last 24 hours' utilization (uPlot charts).

import { gql } from "./api.js";
import { STATE_COLOURS, esc, percent } from "./format.js";

const QUERY = `{ capacity { poolId poolName models {
  model utilization
  now { total booked released reserved free lost }
  ahead { at booked released reserved free lost }
  hourly { at ratio } } } }`;

const STATES = ["booked", "released", "reserved", "free", "lost"];
const body = () => document.getElementById("overview-body");
let charts = [];
let timer = null;

export async function show() {
  await load();
}

export function hide() {
  clearTimeout(timer);
}

export function onEvent() {
  clearTimeout(timer);
  timer = setTimeout(load, 800);
}

async function load() {
  let data;
  try {
    ({ data } = await gql(QUERY));
  } catch (e) {
    body().innerHTML = `<p class="error" role="alert">The capacity overview cannot be shown: ${esc(e.message)}</p>`;
    return;
  }
  for (const c of charts) c.destroy();
  charts = [];
  const pools = data.capacity;
  if (!pools.length) {
    body().innerHTML = `<div class="empty"><h2>No pools to show</h2><p>This key sees no pool: it owns none and is offered none. Platform operators create pools and offers (<code>orl pools create</code>, <code>orl pools offers put</code>).</p></div>`;
    return;
  }
  body().innerHTML = pools.map(poolCard).join("");
  for (const pool of pools) {
    pool.models.forEach((m, i) => {
      forecastChart(document.getElementById(`fc-${pool.poolId}-${i}`), m);
      utilizationChart(document.getElementById(`ut-${pool.poolId}-${i}`), m);
    });
  }
}

function poolCard(pool) {
  if (!pool.models.length) {
    return `<article class="card"><h2>${esc(pool.poolName)} <span class="muted small">${esc(pool.poolId)}</span></h2>
      <p class="empty-line">This pool has no sellable units yet: add nodes to it.</p></article>`;
  }
  const rows = pool.models.map((m) => {
    const n = m.now;
    const cells = STATES.map((s) => `<td class="num">${n[s]}</td>`).join("");
    const peak = m.ahead.reduce((best, p) => Math.max(best, p.booked + p.released + p.reserved), 0);
    return `<tr><th scope="row">${esc(m.model)}</th><td class="num">${n.total}</td>${cells}
      <td class="num">${peak}</td><td class="num">${percent(m.utilization)}</td></tr>`;
  }).join("");
  const charts = pool.models.map((m, i) => `
    <figure class="chart"><figcaption>${esc(m.model)} · next 7 days</figcaption><div id="fc-${esc(pool.poolId)}-${i}"></div></figure>
    <figure class="chart"><figcaption>${esc(m.model)} · utilization, last 24 hours</figcaption><div id="ut-${esc(pool.poolId)}-${i}"></div></figure>`).join("");
  return `<article class="card">
    <h2>${esc(pool.poolName)} <span class="muted small">${esc(pool.poolId)}</span></h2>
    <table class="grid counts">
      <caption class="sr-only">Units of ${esc(pool.poolName)} by model and state</caption>
      <thead><tr><th scope="col">Model</th><th scope="col" class="num">Total</th>
        ${STATES.map((s) => `<th scope="col" class="num"><span class="swatch" style="background:${STATE_COLOURS[s]}"></span>${label(s)}</th>`).join("")}
        <th scope="col" class="num" title="Most units held at once over the next 7 days">Peak held, 7 d</th>
        <th scope="col" class="num">Utilization, 24 h</th></tr></thead>
      <tbody>${rows}</tbody>
    </table>
    <div class="charts">${charts}</div>
  </article>`;
}

function label(state) {
  return { booked: "Booked", released: "Released to spot", reserved: "Reserved", free: "Free", lost: "Lost" }[state];
}

function size(el) {
  return { width: Math.max(280, el.clientWidth || 420), height: 180 };
}

function forecastChart(el, m) {
  const xs = m.ahead.map((p) => p.at / 1000);
  const series = STATES.map((s) => m.ahead.map((p) => p[s]));
  charts.push(new window.uPlot({
    ...size(el),
    scales: { y: { range: (u, min, max) => [0, Math.max(max, 1)] } },
    series: [{}, ...STATES.map((s) => ({ label: label(s), stroke: STATE_COLOURS[s], width: 2, points: { show: false } }))],
    axes: [{}, { label: "units", size: 50 }],
    legend: { live: true },
  }, [xs, ...series], el));
}

function utilizationChart(el, m) {
  const xs = m.hourly.map((p) => p.at / 1000);
  const ys = m.hourly.map((p) => Math.round(p.ratio * 1000) / 10);
  charts.push(new window.uPlot({
    ...size(el),
    scales: { y: { range: [0, 100] } },
    series: [{}, { label: "booked %", stroke: STATE_COLOURS.booked, fill: "rgba(47,111,222,0.15)", width: 2, paths: window.uPlot.paths.stepped({ align: 1 }) }],
    axes: [{}, { label: "%", size: 50 }],
  }, [xs, ys], el));
}
