// SPDX-License-Identifier: AGPL-3.0-or-later
// Drawing the world (loaded before viewer.js, whose `state` it reads): the sim's ground and
// grid, every object at its true size and colour, avatars as a body with a name tag, scripted
// objects marked, floating text over objects, the selection, and a minimap. Canvas 2D, one pass
// a frame; what is off screen is skipped, and labels are drawn for the nearest objects only (at
// most LABELS_MAX), so a thousand objects in view keep the display's frame rate.
"use strict";

const LABELS_MAX = 160;
const GROUND = "#16211a", GRID = "#213026", GRID_FINE = "#1b281f", EDGE = "#4a6";

// An object's shape and colour, parsed once per change (not every frame).
function geometry(o) {
  if (o._sk !== o.shape) {
    const [kind, a, b] = o.shape.split(" ");
    o._sk = o.shape;
    o._geo = kind === "circle" ? { r: +a } : { w: +a, h: +(b ?? a) };
  }
  if (o._ck !== o.color) {
    o._ck = o.color;
    o._fill = "#" + o.color.slice(0, 6);
    o._edge = shade(o.color, 0.55);
  }
  return o._geo;
}

// A darker tone of an `rrggbbaa` colour, for outlines.
function shade(rgba, k) {
  const c = [0, 2, 4].map((i) => Math.round(parseInt(rgba.slice(i, i + 2), 16) * k));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// Where an object of `view` (this sim's, or a neighbour's) is to be drawn at `now` (world
// metres): the own avatar predicted; others moving extrapolated from their last position and
// velocity by the time since the view's last tick came (at most half a second), so motion is
// smooth at the display's frame rate.
function drawnPosition(view, o, now) {
  if (view === state && o.id === state.avatar) return ownPosition(o, now);
  if (o.base && (o.base.vel[0] !== 0 || o.base.vel[1] !== 0)) {
    const rate = (view.status && view.status.tick_rate_hz) || 20;
    const ahead = view.tickAt != null ? Math.min(((now - view.tickAt) * rate) / 1000, rate / 2) : 0;
    const dt = view.tick + ahead - o.base.tick;
    return [(o.base.at[0] + (o.base.vel[0] * dt) / rate) / 1000, (o.base.at[1] + (o.base.vel[1] * dt) / rate) / 1000];
  }
  return [+o.position[0], +o.position[1]];
}

const frames = { drawn: 0, ms: [] };

function draw() {
  const t0 = performance.now();
  try { drawFrame(t0); } finally {
    frames.ms.push(performance.now() - t0);
    if (frames.ms.length > 600) frames.ms.splice(0, 300);
    requestAnimationFrame(draw);
  }
}

function drawFrame(now) {
  const c = $("map"), g = c.getContext("2d");
  const dpr = window.devicePixelRatio || 1;
  const cw = c.clientWidth, ch = c.clientHeight;
  if (c.width !== Math.round(cw * dpr) || c.height !== Math.round(ch * dpr)) { c.width = Math.round(cw * dpr); c.height = Math.round(ch * dpr); }
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const { x, y, scale } = state.view;
  const sx = (wx) => cw / 2 + (wx - x) * scale, sy = (wy) => ch / 2 - (wy - y) * scale;
  g.fillStyle = "#0b0e12"; g.fillRect(0, 0, cw, ch);
  const s = state.status;
  // The sims around this one first (their ground and objects), then this one over them.
  const views = [];
  for (const nb of neighbours.values()) if (nb.status) views.push(nb);
  if (s) views.push(state);
  for (const v of views) drawGround(g, v.status, sx, sy, scale, cw, ch, v === state);
  const avatars = [], labels = [];
  let drawn = 0;
  for (const v of views) drawn += drawObjects(g, v, now, sx, sy, scale, cw, ch, avatars, labels);
  // The own avatar between two sims (it left this one and has not appeared in the next).
  const ghost = state.avatar && !state.byId.has(state.avatar) && state.ghost;
  if (ghost) {
    const at = ownPosition(ghost, now);
    avatars.push([ghost, sx(at[0]), sy(at[1]), true]);
  }
  for (const [o, px, py, main] of avatars) {
    const own = main && o.id === state.avatar, sel = main && o.id === state.selected;
    const r = drawAvatar(g, o, px, py, scale, own);
    if (sel) selectionRing(g, px, py, r);
    labels.push({ o, px, py: py - r - 6, text: o.name, tag: true, own, sel });
  }
  frames.last = { sims: views.length, drawn, own: !!state.avatar && (state.byId.has(state.avatar) || !!ghost) };
  frames.drawn = drawn;
  drawLabels(g, labels, cw, ch);
  for (const v of views) drawPlaceName(g, v, sx, sy);
}

// A view's objects (avatars are kept for later, to be drawn over everything): how many are on
// screen.
function drawObjects(g, view, now, sx, sy, scale, cw, ch, avatars, labels) {
  const main = view === state;
  let drawn = 0;
  for (const o of view.objects) {
    const at = drawnPosition(view, o, now);
    view.drawnAt.set(o.id, at);
    const px = sx(at[0]), py = sy(at[1]);
    const geo = geometry(o);
    const half = Math.max(geo.r ?? Math.max(geo.w, geo.h), 0.3) * scale;
    if (px + half < -40 || px - half > cw + 40 || py + half < -40 || py - half > ch + 40) continue;
    drawn += 1;
    if (o.avatar) { avatars.push([o, px, py, main]); continue; }
    drawShape(g, o, geo, px, py, scale);
    if (o.scripted) {
      // A small mark at the top right: this object runs a script (readable, forkable).
      const mx = px + Math.max(3, (geo.r ?? geo.w) * scale), my = py - Math.max(3, (geo.r ?? geo.h) * scale);
      g.fillStyle = "#6cf"; g.strokeStyle = "#0b0e12"; g.lineWidth = 1;
      g.beginPath(); g.arc(mx, my, 3, 0, 7); g.fill(); g.stroke();
    }
    const selected = main && o.id === state.selected;
    if (selected) selectionRing(g, px, py, half);
    const ly = py - Math.max(half, 3) - 4;
    if (o.text && (scale >= 6 || selected)) labels.push({ o, px, py: ly, text: o.text, tag: false, sel: selected });
    else if (scale >= 20 && o.name) labels.push({ o, px, py: ly, text: o.name, tag: false, dim: true, sel: selected });
  }
  return drawn;
}

function drawGround(g, s, sx, sy, scale, cw, ch, main) {
  const [ox, oy] = s.region_origin, size = s.region_size;
  const left = sx(ox), top = sy(oy + size), side = size * scale;
  g.fillStyle = GROUND; g.fillRect(left, top, side, side);
  // Grid lines every 8 m (every metre too when zoomed in), each set in one path.
  const lines = (step, colour) => {
    g.strokeStyle = colour; g.lineWidth = 1; g.beginPath();
    for (let m = step; m < size; m += step) {
      const vx = Math.round(sx(ox + m)) + 0.5, hy = Math.round(sy(oy + m)) + 0.5;
      if (vx >= 0 && vx <= cw) { g.moveTo(vx, Math.max(top, 0)); g.lineTo(vx, Math.min(top + side, ch)); }
      if (hy >= 0 && hy <= ch) { g.moveTo(Math.max(left, 0), hy); g.lineTo(Math.min(left + side, cw), hy); }
    }
    g.stroke();
  };
  if (scale >= 16) lines(1, GRID_FINE);
  lines(8, GRID);
  g.strokeStyle = main ? EDGE : "#2f4a37"; g.lineWidth = main ? 2 : 1; g.strokeRect(left, top, side, side);
}

// A sim's name in its top left corner (over what is drawn there); this sim's with its owner.
function drawPlaceName(g, view, sx, sy) {
  const s = view.status, main = view === state;
  const left = sx(s.region_origin[0]) + 4, top = sy(s.region_origin[1] + s.region_size) + 4;
  const right = left + s.region_size * state.view.scale, bottom = top + s.region_size * state.view.scale;
  if (!main && (right < 0 || bottom < 0 || left > g.canvas.clientWidth || top > g.canvas.clientHeight)) return;
  const text = main ? placeName() : `sim ${s.sim}`;
  g.font = "600 12px system-ui, sans-serif"; g.textAlign = "left"; g.textBaseline = "middle";
  g.fillStyle = "#0b0e12bb"; g.fillRect(left, top, g.measureText(text).width + 10, 18);
  g.fillStyle = main ? EDGE : "#7a9"; g.fillText(text, left + 5, top + 9.5);
}

// "sim 1 · alice's" (its admin), as the header says it.
function placeName() {
  const s = state.status, gv = state.governance;
  if (!s) return "";
  const owner = gv && (gv.admin_name || (gv.admin ? gv.admin.slice(0, 8) + "…" : ""));
  return owner ? `sim ${s.sim} · ${owner}'s` : `sim ${s.sim}`;
}

function drawShape(g, o, geo, px, py, scale) {
  g.fillStyle = o._fill;
  if (geo.r != null) {
    const r = Math.max(1.5, geo.r * scale);
    g.beginPath(); g.arc(px, py, r, 0, 7); g.fill();
    if (r >= 4) { g.strokeStyle = o._edge; g.lineWidth = 1; g.stroke(); }
  } else {
    const w = Math.max(1.5, geo.w * scale), h = Math.max(1.5, geo.h * scale);
    g.fillRect(px - w, py - h, 2 * w, 2 * h);
    if (w >= 4 && h >= 4) { g.strokeStyle = o._edge; g.lineWidth = 1; g.strokeRect(px - w + 0.5, py - h + 0.5, 2 * w - 1, 2 * h - 1); }
  }
}

// An avatar seen from above: shoulders and a head, facing where it last walked; the own one
// ringed in gold. Returns its radius on screen.
function drawAvatar(g, o, px, py, scale, own) {
  const geo = o._geo, r = Math.max(6, Math.max(geo.r ?? geo.w, 0.3) * scale);
  const v = o.base && o.base.vel;
  if (v && (v[0] !== 0 || v[1] !== 0)) o._face = Math.atan2(-v[1], v[0]);
  const face = o._face ?? -Math.PI / 2;
  g.save();
  g.translate(px, py); g.rotate(face + Math.PI / 2);
  g.fillStyle = o._fill; g.strokeStyle = own ? "#fc4" : "#fff"; g.lineWidth = own ? 2.5 : 1.5;
  g.beginPath(); g.ellipse(0, 0, r, r * 0.62, 0, 0, 7); g.fill(); g.stroke();
  g.fillStyle = "#f4d9b8"; g.strokeStyle = o._edge; g.lineWidth = 1;
  g.beginPath(); g.arc(0, -r * 0.1, r * 0.4, 0, 7); g.fill(); g.stroke();
  // The nose: which way it faces.
  g.fillStyle = "#0b0e12"; g.beginPath(); g.arc(0, -r * 0.42, Math.max(1.2, r * 0.09), 0, 7); g.fill();
  g.restore();
  return r;
}

function selectionRing(g, px, py, r) {
  g.strokeStyle = "#fff"; g.lineWidth = 1.5; g.setLineDash([4, 3]);
  g.beginPath(); g.arc(px, py, r + 5, 0, 7); g.stroke();
  g.setLineDash([]);
}

// Name tags and floating text, nearest the centre of the view first, none overlapping another
// already drawn much (a crowd's tags would be unreadable anyway).
function drawLabels(g, labels, cw, ch) {
  if (!labels.length) return;
  const cx = cw / 2, cy = ch / 2;
  labels.sort((a, b) => b.own - a.own || Math.hypot(a.px - cx, a.py - cy) - Math.hypot(b.px - cx, b.py - cy));
  g.font = "12px system-ui, sans-serif"; g.textAlign = "center"; g.textBaseline = "middle";
  const taken = [];
  let n = 0;
  for (const l of labels) {
    if (n >= LABELS_MAX) break;
    const text = l.text.length > 48 ? l.text.slice(0, 47) + "…" : l.text;
    const w = g.measureText(text).width + 10, h = 17;
    const box = [l.px - w / 2, l.py - h / 2, w, h];
    if (!l.own && !l.sel && taken.some((t) => overlap(t, box) > 0.25 * w * h)) continue;
    taken.push(box);
    n += 1;
    if (l.tag) {
      g.fillStyle = l.own ? "#3a300ecc" : "#000000aa";
      roundRect(g, box[0], box[1], w, h, 8); g.fill();
      g.fillStyle = l.own ? "#fc4" : "#fff";
    } else {
      g.fillStyle = "#00000077"; roundRect(g, box[0], box[1], w, h, 3); g.fill();
      g.fillStyle = l.dim ? "#aab" : "#ffe9a8";
    }
    g.fillText(text, l.px, l.py + 0.5);
  }
}

function overlap(a, b) {
  const w = Math.min(a[0] + a[2], b[0] + b[2]) - Math.max(a[0], b[0]);
  const h = Math.min(a[1] + a[3], b[1] + b[3]) - Math.max(a[1], b[1]);
  return w > 0 && h > 0 ? w * h : 0;
}

function roundRect(g, x, y, w, h, r) {
  g.beginPath(); g.moveTo(x + r, y); g.arcTo(x + w, y, x + w, y + h, r); g.arcTo(x + w, y + h, x, y + h, r);
  g.arcTo(x, y + h, x, y, r); g.arcTo(x, y, x + w, y, r); g.closePath();
}

// The minimap: this sim and those drawn around it, every object a dot (avatars white, the own
// one gold), and the part the map shows. Drawn four times a second, not every frame.
function minimapViews() {
  const views = [];
  for (const nb of neighbours.values()) if (nb.status) views.push(nb);
  if (state.status) views.push(state);
  if (!views.length) return null;
  let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
  for (const v of views) {
    const [ox, oy] = v.status.region_origin, size = v.status.region_size;
    x0 = Math.min(x0, ox); y0 = Math.min(y0, oy); x1 = Math.max(x1, ox + size); y1 = Math.max(y1, oy + size);
  }
  const span = Math.max(x1 - x0, y1 - y0);
  // Centred: a world wider than high sits in the middle, not at the bottom.
  return { views, x0: x0 - (span - (x1 - x0)) / 2, y0: y0 - (span - (y1 - y0)) / 2, span };
}

function drawMinimap() {
  const c = $("minimap"), world = minimapViews();
  if (!c || !world || c.offsetParent === null) return;
  const g = c.getContext("2d"), dpr = window.devicePixelRatio || 1;
  const cw = c.clientWidth, ch = c.clientHeight;
  if (c.width !== Math.round(cw * dpr)) { c.width = Math.round(cw * dpr); c.height = Math.round(ch * dpr); }
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const k = Math.min(cw, ch) / world.span;
  const mx = (wx) => (wx - world.x0) * k, my = (wy) => ch - (wy - world.y0) * k;
  g.clearRect(0, 0, cw, ch);
  for (const v of world.views) {
    const [ox, oy] = v.status.region_origin, size = v.status.region_size;
    g.fillStyle = GROUND; g.fillRect(mx(ox), my(oy + size), size * k, size * k);
    g.strokeStyle = v === state ? EDGE : "#2f4a37"; g.lineWidth = 1;
    g.strokeRect(mx(ox) + 0.5, my(oy + size) + 0.5, size * k - 1, size * k - 1);
  }
  for (const v of world.views) {
    for (const o of v.objects) {
      if (o.avatar) continue;
      const at = v.drawnAt.get(o.id) || [+o.position[0], +o.position[1]];
      g.fillStyle = o._fill || "#888"; g.fillRect(mx(at[0]) - 1, my(at[1]) - 1, 2, 2);
    }
  }
  for (const v of world.views) {
    for (const o of v.objects) {
      if (!o.avatar) continue;
      const own = v === state && o.id === state.avatar;
      const at = v.drawnAt.get(o.id) || [+o.position[0], +o.position[1]];
      g.fillStyle = own ? "#fc4" : "#fff";
      g.beginPath(); g.arc(mx(at[0]), my(at[1]), own ? 3.5 : 2.5, 0, 7); g.fill();
    }
  }
  // The map's view.
  const map = $("map"), { x, y, scale } = state.view;
  const hw = map.clientWidth / 2 / scale, hh = map.clientHeight / 2 / scale;
  g.strokeStyle = "#fffc"; g.lineWidth = 1;
  g.strokeRect(mx(x - hw), my(y + hh), 2 * hw * k, 2 * hh * k);
}

// A click (or tap) on the minimap looks there (and stops following the own avatar).
function setupMinimap() {
  const c = $("minimap");
  c.addEventListener("pointerdown", (e) => {
    e.preventDefault(); e.stopPropagation();
    const world = minimapViews();
    if (!world) return;
    const r = c.getBoundingClientRect(), k = Math.min(r.width, r.height) / world.span;
    state.view.x = world.x0 + (e.clientX - r.left) / k;
    state.view.y = world.y0 + (r.height - (e.clientY - r.top)) / k;
    $("follow").checked = false;
  });
  setInterval(drawMinimap, 250);
}

// The last frames' drawing time (ms) and how many objects the last one drew (for tests).
window.metatopiaFrames = () => ({ drawn: frames.drawn, last: frames.last, ms: frames.ms.slice(-120) });
