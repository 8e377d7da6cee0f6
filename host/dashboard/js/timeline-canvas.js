// The timeline drawn on one <canvas>: only the rows in view are drawn, so a page of
// thousands of unit rows scrolls as fast as a page of ten. Rows are node headers and unit
// rows (grouped by NVLink domain); the x axis is time. Wheel scrolls rows, Ctrl/⌘+wheel
// zooms, Shift+wheel or dragging pans; the keyboard does the same (see `onKey`).

import { DAY, HOUR, STATE_COLOURS, esc, span, tenantColour, when } from "./format.js";

const GUTTER = 230;
const AXIS = 34;
const NODE_ROW = 22;
const UNIT_ROW = 16;
const MIN_SPAN = 15 * 60_000;

const TERM_COLOURS = {
  active: "rgba(142, 91, 216, 0.16)",
  pending: "rgba(142, 91, 216, 0.08)",
  expired: "rgba(120, 120, 120, 0.10)",
  "needs-review": "rgba(230, 140, 20, 0.22)",
};

export class TimelineCanvas {
  constructor({ scroll, spacer, canvas, tip, onPick }) {
    Object.assign(this, { scroll, spacer, canvas, tip, onPick });
    this.rows = [];
    this.offsets = [0];
    this.window = [0, 1];
    this.view = [0, 1];
    this.now = Date.now();
    this.hover = null;
    this.cursor = 0;
    this.highlight = null;
    this.loaded = false;
    this.ctx = canvas.getContext("2d");
    this.stripes = this.pattern("rgba(255,255,255,0.55)", 6);
    this.hatch = this.pattern(STATE_COLOURS.released, 5, true);
    this.bind();
    new ResizeObserver(() => this.resize()).observe(scroll);
  }

  /** A diagonal-stripe fill. */
  pattern(colour, gap, withBack = false) {
    const p = document.createElement("canvas");
    p.width = p.height = gap * 2;
    const c = p.getContext("2d");
    if (withBack) {
      c.fillStyle = "rgba(25, 169, 116, 0.12)";
      c.fillRect(0, 0, p.width, p.height);
    }
    c.strokeStyle = colour;
    c.lineWidth = 2;
    c.beginPath();
    c.moveTo(0, p.height);
    c.lineTo(p.width, 0);
    c.moveTo(-gap, gap);
    c.lineTo(gap, -gap);
    c.moveTo(p.width - gap, p.height + gap);
    c.lineTo(p.width + gap, p.height - gap);
    c.stroke();
    return this.ctx.createPattern(p, "repeat");
  }

  /** Lays out `rows` (from timeline.js) over `window` = [from, to], keeping the zoom when it can. */
  setData(rows, window, now) {
    const whole = !this.loaded || (this.view[0] === this.window[0] && this.view[1] === this.window[1]);
    this.loaded = true;
    this.rows = rows;
    this.now = now;
    this.window = window;
    // A reload keeps the zoom and position the user chose; a whole-window view follows the window.
    if (whole) this.view = [...window];
    else this.view = this.clamp(this.view[0], this.view[1]);
    this.offsets = new Array(rows.length + 1);
    this.offsets[0] = 0;
    rows.forEach((r, i) => { this.offsets[i + 1] = this.offsets[i] + (r.kind === "node" ? NODE_ROW : UNIT_ROW); });
    this.fitSpacer();
    this.cursor = Math.min(this.cursor, Math.max(0, rows.length - 1));
    this.hover = null;
    this.draw();
  }

  /** The canvas sticks to the top of the scroller; the spacer after it makes up the rest of the content's height. */
  fitSpacer() {
    const content = this.offsets[this.rows.length] + AXIS;
    this.spacer.style.height = `${Math.max(0, content - this.scroll.clientHeight)}px`;
  }

  resize() {
    this.fitSpacer();
    const dpr = window.devicePixelRatio || 1;
    const w = this.scroll.clientWidth;
    const h = this.scroll.clientHeight;
    this.canvas.style.width = `${w}px`;
    this.canvas.style.height = `${h}px`;
    this.canvas.width = Math.round(w * dpr);
    this.canvas.height = Math.round(h * dpr);
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.draw();
  }

  get width() { return this.scroll.clientWidth; }
  get height() { return this.scroll.clientHeight; }

  x(t) {
    const [a, b] = this.view;
    return GUTTER + ((t - a) / (b - a)) * (this.width - GUTTER);
  }

  t(x) {
    const [a, b] = this.view;
    return a + ((x - GUTTER) / (this.width - GUTTER)) * (b - a);
  }

  /** The index of the row at content offset `y` (binary search over row offsets). */
  rowAt(y) {
    let lo = 0;
    let hi = this.rows.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.offsets[mid] <= y) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  zoom(factor, at = (this.view[0] + this.view[1]) / 2) {
    const [a, b] = this.view;
    const span = Math.min(this.window[1] - this.window[0], Math.max(MIN_SPAN, (b - a) * factor));
    const left = at - ((at - a) / (b - a)) * span;
    this.setView(left, left + span);
  }

  pan(fraction) {
    const span = this.view[1] - this.view[0];
    this.setView(this.view[0] + span * fraction, this.view[1] + span * fraction);
  }

  /** [a, b] moved inside the window, its span kept (or cut to the window's). */
  clamp(a, b) {
    const [lo, hi] = this.window;
    const span = Math.min(b - a, hi - lo);
    if (a < lo) a = lo;
    if (a + span > hi) a = hi - span;
    return [a, a + span];
  }

  setView(a, b) {
    this.view = this.clamp(a, b);
    this.draw();
  }

  centreOnNow() {
    const span = Math.min(this.view[1] - this.view[0], 2 * DAY);
    this.setView(this.now - span / 4, this.now + (3 * span) / 4);
  }

  draw() {
    if (!this.width) return;
    const c = this.ctx;
    const w = this.width;
    const h = this.height;
    c.clearRect(0, 0, w, h);
    c.font = "12px system-ui, sans-serif";
    c.textBaseline = "middle";
    const top = this.scroll.scrollTop;
    if (!this.rows.length) {
      this.drawAxis();
      return;
    }
    const first = this.rowAt(top);
    for (let i = first; i < this.rows.length; i++) {
      const y = AXIS + this.offsets[i] - top;
      if (y > h) break;
      this.drawRow(this.rows[i], i, y);
    }
    this.drawNow();
    this.drawGangs(first, top);
    this.drawAxis();
  }

  drawRow(row, i, y) {
    const c = this.ctx;
    const w = this.width;
    if (row.kind === "node") {
      c.fillStyle = row.lost ? "#fbe3e3" : row.needsReview ? "#fdf0dc" : "#eef1f6";
      c.fillRect(0, y, w, NODE_ROW);
      c.fillStyle = "#1d2433";
      c.font = "600 12px system-ui, sans-serif";
      c.fillText(clip(c, row.nodeId, GUTTER - 16), 8, y + NODE_ROW / 2);
      c.font = "12px system-ui, sans-serif";
      let flagX = GUTTER + 8;
      const flag = (text, colour) => {
        c.fillStyle = colour;
        const tw = c.measureText(text).width + 12;
        c.fillRect(flagX, y + 3, tw, NODE_ROW - 6);
        c.fillStyle = "#fff";
        c.fillText(text, flagX + 6, y + NODE_ROW / 2);
        flagX += tw + 6;
      };
      if (row.lost) flag("lost", STATE_COLOURS.lost);
      if (row.needsReview) flag("needs review", "#d9822b");
      c.fillStyle = "#5b6475";
      c.fillText(`${row.unitCount} units`, flagX + 4, y + NODE_ROW / 2);
      if (i === this.cursor) this.outlineRow(y, NODE_ROW);
      return;
    }
    if (row.node.lost) {
      c.fillStyle = "rgba(214, 69, 69, 0.08)";
      c.fillRect(GUTTER, y, w - GUTTER, UNIT_ROW);
    }
    c.fillStyle = "#5b6475";
    if (row.firstInDomain && row.domain) c.fillText(clip(c, row.domain, 90), 14, y + UNIT_ROW / 2);
    if (row.domain) {
      c.fillStyle = "#b8c0cc";
      c.fillRect(106, y + (row.firstInDomain ? 3 : 0), 2, UNIT_ROW - (row.firstInDomain ? 3 : 0) - (row.lastInDomain ? 3 : 0));
    }
    c.fillStyle = "#1d2433";
    c.fillText(clip(c, unitLabel(row), GUTTER - 124), 114, y + UNIT_ROW / 2);
    // Node reservation terms: bands behind the bookings.
    for (const band of row.bands) {
      const x0 = Math.max(GUTTER, this.x(band.startsAt));
      const x1 = Math.min(w, this.x(band.endsAt ?? this.window[1]));
      if (x1 <= x0) continue;
      c.fillStyle = TERM_COLOURS[band.status] || TERM_COLOURS.active;
      c.fillRect(x0, y, x1 - x0, UNIT_ROW);
      if (band.released) {
        c.fillStyle = this.hatch;
        c.fillRect(x0, y + 1, x1 - x0, UNIT_ROW - 2);
      }
    }
    // Bookings.
    for (const bar of row.bars) {
      const x0 = Math.max(GUTTER, this.x(bar.start));
      const x1 = Math.min(w, this.x(bar.end));
      if (x1 <= x0) continue;
      const width = Math.max(2, x1 - x0);
      c.globalAlpha = bar.active ? 1 : 0.45;
      c.fillStyle = tenantColour(bar.tenantId);
      c.fillRect(x0, y + 2, width, UNIT_ROW - 4);
      if (bar.spot) {
        c.fillStyle = this.stripes;
        c.fillRect(x0, y + 2, width, UNIT_ROW - 4);
      }
      c.globalAlpha = 1;
      if (this.highlight && bar.reservationId === this.highlight) {
        c.strokeStyle = "#111";
        c.lineWidth = 2;
        c.strokeRect(x0 + 1, y + 2, width - 2, UNIT_ROW - 4);
      }
    }
    if (i === this.cursor) this.outlineRow(y, UNIT_ROW);
  }

  outlineRow(y, height) {
    if (document.activeElement !== this.canvas) return;
    const c = this.ctx;
    c.strokeStyle = "#2f6fde";
    c.lineWidth = 2;
    c.strokeRect(1, y + 1, this.width - 2, height - 2);
  }

  /** Lines joining the bars of the highlighted reservation across rows (a gang's members). */
  drawGangs(first, top) {
    if (!this.highlight) return;
    const c = this.ctx;
    const points = [];
    for (let i = first; i < this.rows.length; i++) {
      const y = AXIS + this.offsets[i] - top;
      if (y > this.height) break;
      const row = this.rows[i];
      if (row.kind !== "unit") continue;
      for (const bar of row.bars) {
        if (bar.reservationId === this.highlight) points.push([Math.max(GUTTER, this.x(bar.start)), y + UNIT_ROW / 2]);
      }
    }
    if (points.length < 2) return;
    c.strokeStyle = "#111";
    c.lineWidth = 1;
    c.setLineDash([3, 3]);
    c.beginPath();
    c.moveTo(points[0][0] - 4, points[0][1]);
    for (const [x, y] of points) c.lineTo(x - 4, y);
    c.stroke();
    c.setLineDash([]);
  }

  drawNow() {
    const x = this.x(this.now);
    if (x < GUTTER || x > this.width) return;
    const c = this.ctx;
    c.strokeStyle = "#d64545";
    c.lineWidth = 1.5;
    c.beginPath();
    c.moveTo(x, AXIS);
    c.lineTo(x, this.height);
    c.stroke();
  }

  drawAxis() {
    const c = this.ctx;
    const w = this.width;
    c.fillStyle = "#fff";
    c.fillRect(0, 0, w, AXIS);
    c.strokeStyle = "#d5dae3";
    c.beginPath();
    c.moveTo(0, AXIS - 0.5);
    c.lineTo(w, AXIS - 0.5);
    c.moveTo(GUTTER - 0.5, 0);
    c.lineTo(GUTTER - 0.5, this.height);
    c.stroke();
    c.fillStyle = "#5b6475";
    c.font = "600 11px system-ui, sans-serif";
    c.fillText("node · NVLink domain · unit", 8, AXIS / 2);
    c.font = "11px system-ui, sans-serif";
    const [a, b] = this.view;
    const pxPerHour = ((w - GUTTER) / (b - a)) * HOUR;
    const step = [1, 2, 3, 6, 12, 24, 48].find((hrs) => hrs * pxPerHour >= 64) || 48;
    const stepMs = step * HOUR;
    const offset = new Date().getTimezoneOffset() * 60_000;
    let t = Math.ceil((a - offset) / stepMs) * stepMs + offset;
    for (; t <= b; t += stepMs) {
      const x = this.x(t);
      const d = new Date(t);
      const midnight = d.getHours() === 0;
      c.strokeStyle = midnight ? "#b8c0cc" : "#e6e9ef";
      c.beginPath();
      c.moveTo(x, midnight ? 4 : AXIS - 8);
      c.lineTo(x, AXIS);
      c.stroke();
      c.fillStyle = midnight ? "#1d2433" : "#5b6475";
      const text = midnight || step >= 24
        ? d.toLocaleDateString(undefined, { weekday: "short", day: "numeric", month: "short" })
        : d.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" });
      c.fillText(text, x + 3, AXIS / 2 - 2);
    }
    const nx = this.x(this.now);
    if (nx >= GUTTER && nx <= w) {
      c.fillStyle = "#d64545";
      c.fillText("now", nx + 3, AXIS - 7);
    }
  }

  /** What is under (x, y) in canvas coordinates: a bar, a band, a node row, or nothing. */
  hit(x, y) {
    if (y < AXIS || !this.rows.length) return null;
    const i = this.rowAt(y - AXIS + this.scroll.scrollTop);
    const row = this.rows[i];
    if (!row) return null;
    if (row.kind === "node") return { row, index: i };
    if (x < GUTTER) return { row, index: i };
    const t = this.t(x);
    const slack = (this.view[1] - this.view[0]) / (this.width - GUTTER) * 2;
    const bar = row.bars.find((b) => b.start - slack <= t && t < b.end + slack);
    if (bar) return { row, index: i, bar };
    const band = row.bands.find((b) => b.startsAt <= t && (b.endsAt == null || t < b.endsAt));
    return { row, index: i, band, at: t };
  }

  bind() {
    const canvas = this.canvas;
    this.scroll.addEventListener("scroll", () => this.draw(), { passive: true });
    canvas.addEventListener("wheel", (e) => {
      if (e.ctrlKey || e.metaKey) {
        e.preventDefault();
        this.zoom(e.deltaY > 0 ? 1.25 : 0.8, this.t(e.offsetX));
      } else if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
        e.preventDefault();
        this.pan((e.shiftKey ? e.deltaY : e.deltaX) / (this.width - GUTTER));
      }
    }, { passive: false });
    let drag = null;
    canvas.addEventListener("mousedown", (e) => { if (e.offsetX > GUTTER) drag = { x: e.clientX, view: [...this.view], moved: false }; });
    window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
    window.addEventListener("mousemove", (e) => {
      if (!drag) return;
      const dx = e.clientX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      const perPx = (drag.view[1] - drag.view[0]) / (this.width - GUTTER);
      this.setView(drag.view[0] - dx * perPx, drag.view[1] - dx * perPx);
    });
    canvas.addEventListener("mousemove", (e) => {
      if (drag?.moved) return;
      this.showTip(this.hit(e.offsetX, e.offsetY), e.offsetX, e.offsetY);
    });
    canvas.addEventListener("mouseleave", () => this.showTip(null));
    canvas.addEventListener("click", (e) => {
      if (drag?.moved) return;
      const hit = this.hit(e.offsetX, e.offsetY);
      if (hit) this.cursor = hit.index;
      this.onPick(hit);
      this.draw();
    });
    canvas.addEventListener("keydown", (e) => this.onKey(e));
    canvas.addEventListener("focus", () => this.draw());
    canvas.addEventListener("blur", () => this.draw());
  }

  /**
   * Keyboard: ↑/↓ move the row cursor, ←/→ pan, +/− zoom, [ and ] pick the previous or
   * next booking on the cursor's row, Enter picks the first booking in view on it, Esc
   * clears the pick, Home/End jump to the first/last row.
   */
  onKey(e) {
    const keys = {
      ArrowUp: () => this.moveCursor(-1),
      ArrowDown: () => this.moveCursor(1),
      PageUp: () => this.moveCursor(-20),
      PageDown: () => this.moveCursor(20),
      Home: () => this.moveCursor(-this.rows.length),
      End: () => this.moveCursor(this.rows.length),
      ArrowLeft: () => this.pan(-0.1),
      ArrowRight: () => this.pan(0.1),
      "+": () => this.zoom(0.8),
      "=": () => this.zoom(0.8),
      "-": () => this.zoom(1.25),
      "]": () => this.step(1),
      "[": () => this.step(-1),
      Enter: () => this.step(0),
      Escape: () => { this.highlight = null; this.onPick(null); this.draw(); },
    };
    const act = keys[e.key];
    if (!act) return;
    e.preventDefault();
    act();
  }

  moveCursor(delta) {
    if (!this.rows.length) return;
    this.cursor = Math.max(0, Math.min(this.rows.length - 1, this.cursor + delta));
    const top = this.offsets[this.cursor];
    const bottom = this.offsets[this.cursor + 1];
    const visible = this.height - AXIS;
    if (top < this.scroll.scrollTop) this.scroll.scrollTop = top;
    else if (bottom > this.scroll.scrollTop + visible) this.scroll.scrollTop = bottom - visible;
    this.draw();
  }

  /** Picks a booking on the cursor's row: the next (1), previous (-1) or first in view (0). */
  step(direction) {
    const row = this.rows[this.cursor];
    if (!row || row.kind !== "unit" || !row.bars.length) {
      this.onPick(row ? { row, index: this.cursor } : null);
      return;
    }
    const bars = row.bars;
    let i = bars.findIndex((b) => b === this.picked);
    if (direction === 0 || i < 0) i = Math.max(0, bars.findIndex((b) => b.end > this.view[0]));
    else i = (i + direction + bars.length) % bars.length;
    const bar = bars[i];
    this.picked = bar;
    if (bar.end < this.view[0] || bar.start > this.view[1]) {
      const span = this.view[1] - this.view[0];
      this.setView(bar.start - span / 4, bar.start + (3 * span) / 4);
    }
    this.onPick({ row, index: this.cursor, bar });
  }

  showTip(hit, x, y) {
    const tip = this.tip;
    const reservation = hit?.bar?.reservationId ?? null;
    if (reservation !== this.highlight) {
      this.highlight = reservation;
      this.draw();
    }
    if (!hit || (!hit.bar && !hit.band && hit.row.kind !== "node")) {
      tip.hidden = true;
      return;
    }
    tip.innerHTML = describeHit(hit);
    tip.hidden = false;
    const left = Math.min(x + 14, this.width - tip.offsetWidth - 4);
    tip.style.left = `${Math.max(0, left)}px`;
    tip.style.top = `${y + 16}px`;
  }
}

/** A unit's id without its node's id in front (`h100-1-gpu3` on `h100-1` is `gpu3`). */
function unitLabel(row) {
  const id = row.unit.id;
  const node = row.node.nodeId;
  return id.length > node.length + 1 && id.startsWith(node) && /[-_.:/]/.test(id[node.length])
    ? id.slice(node.length + 1)
    : id;
}

/** Text that fits `max` px. */
function clip(c, text, max) {
  if (c.measureText(text).width <= max) return text;
  let s = text;
  while (s.length > 1 && c.measureText(`${s}…`).width > max) s = s.slice(0, -1);
  return `${s}…`;
}

/** What a tooltip or the detail panel says about a hit. */
export function describeHit(hit) {
  if (hit.bar) {
    const b = hit.bar;
    const holder = b.reservationId
      ? `<strong>${esc(b.reservationId)}</strong><br>tenant ${esc(b.tenantId)} · ${esc(b.state)}`
      : `<strong>Booked</strong><br><span class="muted">by another org (hidden from this key)</span>`;
    const marks = [b.spot ? "spot" : "on demand", b.gang ? "gang (units on several nodes)" : null, b.active ? null : "released early"].filter(Boolean).join(" · ");
    return `${holder}<br>${esc(when(b.start))} → ${esc(when(b.end))} (${esc(span(b.end - b.start))})<br>
      ${esc(hit.row.node.nodeId)} · unit ${esc(hit.row.unit.id)}<br><span class="muted">${esc(marks)}</span>`;
  }
  if (hit.band) {
    const t = hit.band;
    const released = t.released ? "<br>this unit is released to spot" : "";
    return `<strong>Node reservation ${esc(t.id)}</strong> · ${esc(t.status)}<br>
      ${esc(when(t.startsAt))} → ${esc(when(t.endsAt))}<br>audience: ${esc(t.allowedOrgIds.join(", ") || "—")}${released}`;
  }
  if (hit.row.kind === "node") {
    const r = hit.row;
    const flags = [r.lost ? "lost: its agent stopped reporting" : null, r.needsReview ? "a node reservation needs review: its units are withheld" : null].filter(Boolean);
    return `<strong>${esc(r.nodeId)}</strong> · ${r.unitCount} units${flags.length ? `<br>${esc(flags.join("; "))}` : ""}`;
  }
  return `<strong>${esc(hit.row.unit.id)}</strong> on ${esc(hit.row.node.nodeId)}<br>${esc(hit.row.unit.model)}${hit.row.domain ? ` · NVLink ${esc(hit.row.domain)}` : ""}<br><span class="muted">nothing booked here</span>`;
}
