// Formatting shared by the views: instants, durations, colours, escaping.

export const HOUR = 3_600_000;
export const DAY = 24 * HOUR;

/** Text safe to put in innerHTML. */
export function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** An epoch-ms instant as local date and time, e.g. "Tue 2 Dec 14:05". */
export function when(ms) {
  if (ms == null) return "open-ended";
  const d = new Date(ms);
  return d.toLocaleString(undefined, { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" });
}

/** A duration in ms as "3 d 4 h", "45 min". */
export function span(ms) {
  const m = Math.round(ms / 60000);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h${m % 60 ? ` ${m % 60} min` : ""}`;
  return `${Math.floor(h / 24)} d${h % 24 ? ` ${h % 24} h` : ""}`;
}

export function percent(ratio) {
  return `${(ratio * 100).toFixed(ratio < 0.1 && ratio > 0 ? 1 : 0)} %`;
}

/** A stable, distinguishable colour for a tenant id. */
export function tenantColour(id) {
  if (!id) return "#8a94a6";
  let h = 2166136261;
  for (const c of id) h = Math.imul(h ^ c.charCodeAt(0), 16777619);
  const hue = ((h >>> 0) % 360 + 360) % 360;
  return `hsl(${hue} 62% 46%)`;
}

/** The colours of unit states, shared by the overview's charts and the timeline. */
export const STATE_COLOURS = {
  booked: "#2f6fde",
  released: "#19a974",
  reserved: "#8e5bd8",
  free: "#c6ccd6",
  lost: "#d64545",
};
