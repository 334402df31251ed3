// SPDX-License-Identifier: AGPL-3.0-or-later
// The Metatopia web viewer: the node's JSON API for what is there, and signed events for what
// you do. The key is an Ed25519 key made by the browser (WebCrypto) and kept in local storage;
// events are encoded exactly as the Rust side does (postcard) and signed over the same
// domain-separated bytes, so a node checks them like any client's.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  status: null, objects: [], byId: new Map(), selected: null, chatSince: 0,
  key: null, account: null, nonce: 0, name: null, avatar: null,
  view: { x: 32, y: 32, scale: 8 }, drag: null, velocity: [0, 0],
  // The own avatar, predicted: a walk key moves it on screen at once, before its input is
  // agreed and executed (a few round trips away); `pred` is the walk being predicted, `drawn`
  // where the avatar was last drawn (it eases onto the committed position, never snaps).
  pred: null, drawn: null, keyAt: null,
  // Where each object was last drawn, and the last tick message and when it came.
  drawnAt: new Map(), tick: 0, tickAt: null, ticksSeen: 0,
};
// Key press to the own avatar's first move on screen, in ms (read by the browser test).
window.metatopiaMoveLatency = [];

// ---- postcard encoding (varints, zigzag, length-prefixed strings) ----
class Writer {
  constructor() { this.bytes = []; }
  varint(v) { let n = BigInt(v); do { let b = Number(n & 0x7fn); n >>= 7n; if (n) b |= 0x80; this.bytes.push(b); } while (n); }
  zigzag(v) { const n = BigInt(v); this.varint(n >= 0n ? n << 1n : ((-n) << 1n) - 1n); }
  raw(arr) { for (const b of arr) this.bytes.push(b); }
  string(s) { const u = new TextEncoder().encode(s); this.varint(u.length); this.raw(u); }
  out() { return new Uint8Array(this.bytes); }
}

const FX_ONE = 65536;
const fx = (x) => Math.round(x * FX_ONE);
const objectBits = (id) => { const [slot, gen] = id.split("v").map(BigInt); return (slot << 32n) | gen; };
const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
const unhex = (s) => Uint8Array.from(s.match(/../g).map((h) => parseInt(h, 16)));

// Payloads, in the order of `sim::event::Payload`'s variants; chat ranges in `ChatRange`'s.
const PAYLOAD = { Login: 0, Logout: 1, Move: 2, Chat: 3, Touch: 4, Rez: 5, Derez: 6, DeployScript: 7, Edit: 11 };
const BODY = { static: 0, kinematic: 1, dynamic: 2 };
const RANGE = { whisper: 0, say: 1, shout: 2 };
// `Shape`: a box of half sizes, or a circle of a radius (metres).
function shape(w, s) {
  if (s.circle != null) { w.varint(0); w.zigzag(fx(s.circle)); } else { w.varint(1); w.zigzag(fx(s.box[0])); w.zigzag(fx(s.box[1])); }
}
// `Option<T>`: a 0 byte, or a 1 byte and the value.
function option(w, v, put) { if (v == null) w.varint(0); else { w.varint(1); put(v); } }
function encodeBody(payload) {
  const w = new Writer();
  w.varint(state.status.sim);
  w.raw(unhex(state.account));
  w.varint(state.nonce);
  w.varint(PAYLOAD[payload.kind]);
  switch (payload.kind) {
    case "Login": w.string(payload.name); break;
    case "Logout": break;
    case "Move": w.varint(objectBits(payload.object)); w.zigzag(fx(payload.velocity[0])); w.zigzag(fx(payload.velocity[1])); break;
    case "Chat": w.zigzag(payload.channel); w.varint(payload.range ?? 1); w.string(payload.text); break;
    case "Touch": w.varint(objectBits(payload.object)); break;
    case "Rez":
      w.string(payload.name); shape(w, payload.shape);
      w.zigzag(fx(payload.at[0])); w.zigzag(fx(payload.at[1]));
      w.varint(payload.color); w.string(payload.text); w.varint(BODY[payload.body]);
      break;
    case "Derez": w.varint(objectBits(payload.object)); break;
    case "DeployScript":
      w.varint(objectBits(payload.object)); w.string(payload.source); w.string(payload.licence);
      option(w, payload.derived_from, (id) => w.raw(unhex(id)));
      break;
    case "Edit": {
      const e = payload.edit;
      w.varint(objectBits(payload.object));
      option(w, e.name, (v) => w.string(v));
      option(w, e.text, (v) => w.string(v));
      option(w, e.color, (v) => w.varint(v));
      option(w, e.shape, (v) => shape(w, v));
      option(w, e.at, (v) => { w.zigzag(fx(v[0])); w.zigzag(fx(v[1])); });
      option(w, e.body, (v) => w.varint(BODY[v]));
      option(w, e.surface, (v) => { w.zigzag(fx(v.friction)); w.zigzag(fx(v.restitution)); w.zigzag(fx(v.damping)); });
      break;
    }
  }
  return w.out();
}

const DOMAIN = new TextEncoder().encode("metatopia/event/v1\0");

// The key: WebCrypto's Ed25519 where the browser has it; otherwise TweetNaCl (audited, public
// domain, shipped as /nacl.js: tweetnacl 1.0.3 nacl-fast.min.js). Both sign the same bytes.
async function loadKey() {
  try {
    await loadWebCryptoKey();
    state.signer = "webcrypto";
  } catch (e) {
    await loadNaclKey();
    state.signer = "tweetnacl";
  }
}

async function loadWebCryptoKey() {
  if (!crypto.subtle) throw new Error("no WebCrypto (the page needs localhost or https)");
  const saved = localStorage.getItem("metatopia-key");
  let pair;
  if (saved) {
    const priv = await crypto.subtle.importKey("pkcs8", unhex(saved), { name: "Ed25519" }, true, ["sign"]);
    const jwk = await crypto.subtle.exportKey("jwk", priv);
    const pub = await crypto.subtle.importKey("jwk", { kty: "OKP", crv: "Ed25519", x: jwk.x }, { name: "Ed25519" }, true, ["verify"]);
    pair = { privateKey: priv, publicKey: pub };
  } else {
    pair = await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"]);
    localStorage.setItem("metatopia-key", hex(new Uint8Array(await crypto.subtle.exportKey("pkcs8", pair.privateKey))));
  }
  state.key = pair.privateKey;
  state.account = hex(new Uint8Array(await crypto.subtle.exportKey("raw", pair.publicKey)));
}

async function loadNaclKey() {
  await new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = "/nacl.js"; s.onload = resolve; s.onerror = () => reject(new Error("no signing library"));
    document.head.append(s);
  });
  let seed = localStorage.getItem("metatopia-seed");
  if (!seed) { seed = hex(crypto.getRandomValues(new Uint8Array(32))); localStorage.setItem("metatopia-seed", seed); }
  const kp = window.nacl.sign.keyPair.fromSeed(unhex(seed));
  state.secret = kp.secretKey;
  state.account = hex(kp.publicKey);
}

async function sign(msg) {
  if (state.signer === "tweetnacl") return window.nacl.sign.detached(msg, state.secret);
  return new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, state.key, msg));
}

// ---- the WebSocket gateway (node/src/gateway.rs) ----
let ws = null, refSeq = 0;
const pending = new Map();   // submit ref -> { resolve, reject }
const waiting = new Map();   // event id -> resolve(outcome)
const early = new Map();     // outcomes that came before their waiter
const replies = { object: [], account: [] };

// What the viewer tells the player about the sim's health, over the map: the node is
// unreachable (it reconnects, with a growing pause) or the sim is paused (too few of its
// validators reach each other to agree on ticks; it resumes by itself). Tests read
// `body[data-banner]`.
let attempts = 0;
function banner(kind, text) {
  const b = $("banner");
  b.hidden = !kind;
  b.dataset.kind = kind || "";
  b.textContent = text || "";
  document.body.dataset.banner = kind || "";
}

// ---- the nearest node: the page's node says which nodes serve the sim (`route`, with each
// one's HTTP address); the viewer measures the round trip to each (two `ping`s on a WebSocket
// to each, at once) and uses the nearest, as the native client does: nodes within 25 % and
// 5 ms of the nearest count as equally near and viewers spread over them by account. It
// measures again every 20 s and moves to a clearly nearer node; when its node dies it tries
// the others nearest first. ----
const scheme = location.protocol === "https:" ? "wss" : "ws";
let wsHost = location.host;
const near = { nodes: [], rtts: [], timer: null };

function probeNode(http) {
  return new Promise((resolve) => {
    let best = null, t0 = 0, sent = 0, w;
    const done = () => { clearTimeout(timer); try { w.close(); } catch (_) {} resolve(best); };
    const timer = setTimeout(done, 2000);
    const send = () => { sent += 1; t0 = performance.now(); w.send(JSON.stringify({ ping: { ref: sent } })); };
    try { w = new WebSocket(`${scheme}://${http}/v1/ws`); } catch (_) { return done(); }
    w.onopen = send;
    w.onerror = done;
    w.onmessage = (e) => {
      const m = JSON.parse(e.data);
      if (!m.pong) return;
      const rtt = performance.now() - t0;
      best = best === null ? rtt : Math.min(best, rtt);
      if (sent >= 2) done(); else send();
    };
  });
}

function asNear(rtt, best) { return rtt <= best * 1.25 + 5; }

function chooseNode(rtts) {
  const answered = rtts.filter((r) => r !== null);
  if (!answered.length) return -1;
  const best = Math.min(...answered);
  const close = rtts.map((r, i) => [r, i]).filter(([r]) => r !== null && asNear(r, best)).map(([, i]) => i);
  const hash = parseInt((state.account || "0").slice(0, 8), 16) || 0;
  return close[hash % close.length];
}

async function measureNodes() {
  const nodes = near.nodes;
  const rtts = await Promise.all(nodes.map((n) => (n.http ? probeNode(n.http) : Promise.resolve(null))));
  if (nodes !== near.nodes) return;
  near.rtts = rtts;
  window.metatopiaRoundTrips = rtts;
  const to = chooseNode(rtts);
  if (to < 0) return;
  const cur = nodes.findIndex((n) => n.http === wsHost);
  const clearly = cur < 0 || rtts[cur] === null || (rtts[to] < rtts[cur] && !asNear(rtts[cur], rtts[to]));
  if (nodes[to].http !== wsHost && clearly) moveTo(nodes[to].http);
}

function moveTo(http) {
  wsHost = http;
  document.body.dataset.node = http;
  if (ws) { ws.onclose = null; ws.close(); }
  connect();
}

// After the node in use died: the others, nearest first.
function nextNode() {
  const order = near.nodes.map((n, i) => i).filter((i) => near.nodes[i].http && near.nodes[i].http !== wsHost);
  order.sort((a, b) => (near.rtts[a] ?? Infinity) - (near.rtts[b] ?? Infinity));
  return order.length ? near.nodes[order[(attempts - 1) % order.length]].http : wsHost;
}

function connect() {
  document.body.dataset.node = wsHost;
  ws = new WebSocket(`${scheme}://${wsHost}/v1/ws`);
  ws.onmessage = (e) => handle(JSON.parse(e.data));
  ws.onclose = mainClosed;
  routesLost();
  ws.onopen = () => {
    attempts = 0;
    banner("", "");
    notice("");
    if (!near.nodes.length) askRoute({ route: { account: state.account || NOBODY } }).then((m) => m && useRoute(m));
    if (state.status) ws.send(JSON.stringify({ governance: {} }));
    // A returning visitor (a name kept with the key) enters at once; a new one chooses a name.
    if (state.account && !state.avatar && localStorage.getItem("metatopia-name")) login().catch((e) => notice(String(e.message || e)));
    else if (state.account && !state.avatar) askName();
  };
}

// The socket to this sim's node closed: say so, and connect again (to another node of the sim
// after the first attempt), with a growing pause.
function mainClosed() {
  attempts += 1;
  const wait = Math.min(1000 * attempts, 5000);
  banner("unreachable", `The node ${wsHost} is unreachable. Reconnecting in ${wait / 1000} s (attempt ${attempts})…`);
  setTimeout(() => { if (near.nodes.length > 1) wsHost = nextNode(); connect(); }, wait);
}

// The nodes of the sim to use (a `route` answer): measured, and the nearest used.
function useRoute(m) {
  near.nodes = m.nodes.filter((n) => n.http);
  measureNodes();
  if (!near.timer) near.timer = setInterval(measureNodes, 20000);
}

// Questions in flight, oldest first: a node answers a session's questions in order, so the
// node's "busy" is the oldest's, asked again after a pause.
const asked = [];
const BUSY = "the node is busy: ask again";
function request(kind, id) {
  return new Promise((resolve) => {
    replies[kind].push(resolve); asked.push({ kind, id }); ws.send(JSON.stringify({ [kind]: { id } }));
  });
}
function askAgain() {
  const q = asked[0];
  if (q) setTimeout(() => ws.send(JSON.stringify({ [q.kind]: { id: q.id } })), 250);
}

// Whole millimetres of a decimal (what dead reckoning counts in).
function mm(decimal) { return Math.floor(parseFloat(decimal) * 1000 + 1e-6); }

// A tick's changes to a sim's view (this sim's, `state`, or a neighbour's): objects that
// entered, what changed in others (null: unchanged), those that left. Motion is dead reckoned:
// a new position comes only when extrapolating from the last one drifts too far.
function applyTick(view, m) {
  for (const o of m.enter) {
    o.base = { at: o.position.map(mm), vel: o.velocity.map(mm), tick: m.tick };
    view.byId.set(o.id, o);
  }
  for (const u of m.update) {
    const o = view.byId.get(u.id);
    if (!o) continue;
    for (const [k, v] of Object.entries(u)) {
      if (v === null || k === "at_mm" || k === "vel_mm") continue;
      o[k] = v;
    }
    if (u.at_mm) {
      o.base = { at: u.at_mm, vel: u.vel_mm || o.base.vel, tick: m.tick };
      // Placed or stopped objects too: the position is the one just sent.
      o.position = u.at_mm.map((v) => String(v / 1000));
    }
  }
  for (const id of m.leave) { view.byId.delete(id); view.drawnAt.delete(id); }
  const rate = (view.status && view.status.tick_rate_hz) || 20;
  for (const o of view.byId.values()) {
    const b = o.base;
    if (!b || (b.vel[0] === 0 && b.vel[1] === 0)) continue;
    const dt = m.tick - b.tick;
    o.position = [0, 1].map((i) => String((b.at[i] + Math.trunc((b.vel[i] * dt) / rate)) / 1000));
  }
  view.objects = Array.from(view.byId.values());
  view.tick = m.tick; view.tickAt = performance.now();
}

// Messages are serde's externally tagged form, the same messages the native client gets:
// `{"tick": {...}}`, `{"chat": {...}}`.
function handle(msg) {
  const [type, m] = Object.entries(msg)[0];
  switch (type) {
    case "status": applyStatus(m); break;
    case "tick":
      if (state.avatar && m.leave.includes(state.avatar)) leftSim();
      applyTick(state, m);
      state.dirty = true;
      state.ticksSeen = (state.ticksSeen || 0) + 1;
      document.body.dataset.tick = m.tick; $("st-tick").textContent = m.tick;
      break;
    case "chat": addChat(m); break;
    case "submitted": pending.get(m.ref)?.resolve(m.id); pending.delete(m.ref); break;
    case "error":
      if (m.ref != null && pending.has(m.ref)) { pending.get(m.ref).reject(new Error(m.message)); pending.delete(m.ref); }
      else if (m.message === BUSY && m.ref == null && asked.length) askAgain();
      else notice(m.message);
      break;
    case "outcome":
      if (waiting.has(m.id)) { waiting.get(m.id)(m.outcome); waiting.delete(m.id); } else early.set(m.id, m.outcome);
      break;
    case "object": asked.shift(); replies.object.shift()?.(m.object); break;
    case "account": asked.shift(); replies.account.shift()?.(m.account); break;
    case "route": routeWaiters.shift()?.(m); break;
    case "pong": break;
    case "governance": state.governance = m; showPlace(); break;
  }
}

// Sign and submit; resolves with the outcome once the sim executed it (null if not in 15 s).
// Acts are numbered, signed and submitted one at a time, in the order they were made: each
// takes the next nonce, and a sim refuses a nonce below one it has executed, so a key's release
// that overtook its press (their signatures resolve in any order) left the walk refused.
let submitting = Promise.resolve();
// A walk's changes go out as far apart as they were made (`made`: when the key went down or
// up). Acts go out one at a time, so a press held up on its way (its account asked for from a
// loaded node) let the release follow at once: both executed in one tick, the walk cut short.
let walkPace = null;
async function submitInTurn(payload, made) {
  const acct = await request("account", state.account);
  state.nonce = Math.max(state.nonce + 1, (acct ? acct.last_nonce : 0) + 1);
  const body = encodeBody(payload);
  const msg = new Uint8Array(DOMAIN.length + body.length);
  msg.set(DOMAIN); msg.set(body, DOMAIN.length);
  const sig = await sign(msg);
  const event = new Uint8Array(body.length + 64);
  event.set(body); event.set(sig, body.length);
  if (made !== undefined) {
    const wait = walkPace ? walkPace.sent + (made - walkPace.made) - performance.now() : 0;
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    walkPace = { made, sent: performance.now() };
  }
  const ref = ++refSeq;
  return new Promise((resolve, reject) => {
    pending.set(ref, { resolve, reject });
    ws.send(JSON.stringify({ submit: { ref, event: hex(event) } }));
    // Never holding up the acts after it for long (a connection lost meanwhile).
    setTimeout(() => { if (pending.delete(ref)) reject(new Error("the node did not take the event in within 15 s")); }, 15000);
  });
}

async function act(payload, made) {
  const submitted = submitting.then(() => submitInTurn(payload, made));
  submitting = submitted.catch(() => {});
  const id = await submitted;
  const o = early.get(id) || await new Promise((resolve) => {
    waiting.set(id, resolve);
    setTimeout(() => { if (waiting.delete(id)) resolve(null); }, 15000);
  });
  early.delete(id);
  if (!o) notice(`${payload.kind} not executed yet`);
  else if (o.refused) notice(`${payload.kind} refused at tick ${o.refused.tick}: ${o.refused.reason}`);
  return o;
}

function notice(text) { $("notice").textContent = text; }

// The sim is paused when fewer validators reach each other than a quorum (2f + 1 of n), or
// when no tick has come for 3 s.
function checkPaused(s) {
  const n = s.validators || 0, f = Math.floor((n - 1) / 3), quorum = 2 * f + 1;
  const stale = s.last_executed_unix_ms && Date.now() - s.last_executed_unix_ms > 3000;
  if (n > 0 && s.validators_connected < quorum) {
    banner("paused", `The sim is paused: ${s.validators_connected} of its ${n} validators are reachable and it needs ${quorum} to go on. It resumes by itself when they are back.`);
  } else if (stale) {
    banner("paused", `The sim is paused: no tick for ${Math.round((Date.now() - s.last_executed_unix_ms) / 1000)} s. It resumes by itself.`);
  } else if (document.body.dataset.banner === "paused") {
    banner("", "");
  }
}

// The header's place: the sim and who owns it (its admin; and a temp admin while one acts).
function showPlace() {
  const s = state.status, gv = state.governance;
  const sim = s ? `sim ${s.sim}` : "?";
  let owner = "";
  if (gv) {
    owner = `owned by ${gv.admin_name || short(gv.admin)}`;
    if (gv.temp_admin) owner += ` · temp admin ${gv.temp_admin_name || short(gv.temp_admin)}`;
  }
  if ($("st-sim").textContent !== sim) $("st-sim").textContent = sim;
  if ($("st-owner").textContent !== owner) $("st-owner").textContent = owner;
}

// A long id (a 64-digit key or hash) as its first 8 digits; short ones as they are.
const short = (id) => (id && id.length > 16 ? id.slice(0, 8) + "…" : id || "");

function applyStatus(s) {
  if (state.placeSim != null && s.sim !== state.placeSim) {
    // Another sim's node (the avatar went there without a neighbour's view to take over):
    // nothing of the last sim's objects stays.
    state.byId.clear(); state.objects = []; state.drawnAt.clear();
  }
  state.status = s;
  document.body.dataset.sim = s.sim;
  checkPaused(s);
  document.body.dataset.tick = s.tick;
  if (state.placeSim !== s.sim && ws && ws.readyState === 1) {
    // Another sim (or the first status): who governs it, and its neighbours.
    state.placeSim = s.sim; state.governance = null;
    ws.send(JSON.stringify({ governance: {} }));
    findNeighbours();
  }
  showPlace();
  $("st-node").textContent = `${s.node} of ${s.validators}`;
  $("st-tick").textContent = s.tick;
  $("st-dilation").textContent = s.dilation.toFixed(2);
}

// The round trip to the node, for the status bar.
async function ping() {
  const t0 = performance.now();
  await request("account", state.account || "0".repeat(64));
  $("st-latency").textContent = (performance.now() - t0).toFixed(0);
}

// The objects list: grouped (avatars, mine, scripted, others), each in name order, filtered by
// the search box (name, floating text or id), at most GROUP_MAX shown a group.
const GROUPS = [["avatars", "avatars"], ["mine", "mine"], ["scripted", "scripted"], ["others", "others"]];
const GROUP_MAX = 200;
const byName = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
function groupOf(o) {
  if (o.avatar) return "avatars";
  if (state.account && o.owner === state.account) return "mine";
  return o.scripted ? "scripted" : "others";
}

function renderObjects() {
  const query = $("obj-search").value.trim().toLowerCase();
  if (!state.dirty && query === state.query) return;
  state.dirty = false; state.query = query;
  const list = state.objects;
  const me = state.avatar && state.byId.get(state.avatar);
  if (me && $("follow").checked) { state.view.x = +me.position[0]; state.view.y = +me.position[1]; }
  const box = $("objects");
  if (!box.children.length) {
    for (const [key, title] of GROUPS) {
      const h = document.createElement("h3"), ul = document.createElement("ul");
      h.dataset.group = key; h.textContent = title; ul.dataset.group = key;
      h.onclick = () => { ul.hidden = !ul.hidden; };
      box.append(h, ul);
    }
  }
  const groups = new Map(GROUPS.map(([k]) => [k, []]));
  for (const o of list) {
    if (query && !o.name.toLowerCase().includes(query) && !(o.text || "").toLowerCase().includes(query) && o.id !== query) continue;
    groups.get(groupOf(o)).push(o);
  }
  let total = 0;
  for (const [key, title] of GROUPS) {
    const ul = box.querySelector(`ul[data-group="${key}"]`), h = box.querySelector(`h3[data-group="${key}"]`);
    const all = groups.get(key).sort((p, q) => byName.compare(p.name, q.name) || byName.compare(p.id, q.id));
    total += all.length;
    const head = `${title} (${all.length})`;
    if (h.textContent !== head) h.textContent = head;
    h.hidden = all.length === 0;
    // Keep each object's <li> across renders (keyed by id) and touch the DOM only where something
    // changed: a list rebuilt every tick swallows clicks landing while it is rebuilt.
    const have = new Map(Array.from(ul.children, (li) => [li.dataset.id, li]));
    const items = all.slice(0, GROUP_MAX).map((o) => objectItem(o, have.get(String(o.id))));
    if (all.length > GROUP_MAX) {
      const more = have.get("more") || Object.assign(document.createElement("li"), { className: "more" });
      more.dataset.id = "more";
      more.textContent = `and ${all.length - GROUP_MAX} more: search to narrow`;
      items.push(more);
    }
    if (items.length !== ul.children.length || items.some((li, i) => ul.children[i] !== li)) ul.replaceChildren(...items);
  }
  const count = query ? `${total} of ${list.length}` : `${list.length}`;
  if ($("obj-count").textContent !== count) $("obj-count").textContent = count;
  if (state.selected) {
    const o = state.byId.get(state.selected);
    if (o) { $("sel-text").textContent = o.text; $("sel-text").dataset.text = o.text; }
  }
}

function objectItem(o, li) {
  if (!li) {
    li = document.createElement("li");
    li.dataset.id = o.id;
    li.onclick = () => { select(o.id); lookAt(o); };
  }
  const text = `${o.avatar ? "☺" : o.scripted ? "✎" : "□"} ${o.name}${o.text ? " — " + o.text : ""}`;
  if (li.dataset.name !== o.name) li.dataset.name = o.name;
  if (li.dataset.text !== o.text) li.dataset.text = o.text;
  const at = `${Math.floor(+o.position[0])},${Math.floor(+o.position[1])}`;
  if (li.dataset.at !== at) li.dataset.at = at;
  if (li.textContent !== text) li.textContent = text;
  const cls = o.id === state.selected ? "sel" : "";
  if (li.className !== cls) li.className = cls;
  return li;
}

// Bring an object into view (picked from the list): the map looks at it unless it is on screen.
function lookAt(o) {
  const c = $("map"), { x, y, scale } = state.view;
  const dx = (+o.position[0] - x) * scale, dy = (+o.position[1] - y) * scale;
  if (Math.abs(dx) < c.clientWidth / 2 - 20 && Math.abs(dy) < c.clientHeight / 2 - 20) return;
  $("follow").checked = false;
  state.view.x = +o.position[0]; state.view.y = +o.position[1];
}

// A chat line: who (ids shortened), how far it carried (whispers in italics, shouts in bold),
// the channel if not 0, and private lines (one's scripts' errors) marked and in red.
function addChat(l) {
  const ul = $("chat-log");
  const key = `${l.tick}|${l.name}|${l.channel}|${l.text}`;
  if (Array.from(ul.children).some((li) => li.dataset.key === key)) return;
  const li = document.createElement("li");
  li.dataset.key = key;
  const range = l.range_m <= 10 ? "whisper" : l.range_m >= 100 ? "shout" : "say";
  li.dataset.range = range;
  li.className = l.to ? "private" : range === "say" ? "" : range;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = /^[0-9a-f]{40,}$/i.test(l.name) ? short(l.name) : l.name;
  who.title = l.name;
  const verb = l.to ? " (to you only)" : range === "whisper" ? " whispers" : range === "shout" ? " shouts" : "";
  li.append(`${l.to ? "[debug] " : l.channel ? `[${l.channel}] ` : ""}`, who, `${verb}: ${l.text}`);
  ul.appendChild(li);
  while (ul.children.length > 300) ul.firstChild.remove();
  ul.scrollTop = ul.scrollHeight;
}

// A copy button for a long id: copies it whole (the text shows it shortened).
function copyButton(id) {
  const b = document.createElement("button");
  b.type = "button"; b.className = "copy"; b.textContent = "copy"; b.title = id; b.dataset.copy = id;
  b.onclick = async () => {
    try { await navigator.clipboard.writeText(id); } catch (_) {
      // No clipboard permission (an old browser, plain http elsewhere than localhost).
      const t = Object.assign(document.createElement("textarea"), { value: id });
      document.body.append(t); t.select(); document.execCommand("copy"); t.remove();
    }
    b.dataset.copied = "true"; b.textContent = "copied";
    setTimeout(() => { b.dataset.copied = "false"; b.textContent = "copy"; }, 1500);
  };
  return b;
}

async function select(id) {
  state.selected = id;
  const o = await request("object", id);
  if (!o) return;
  state.selectedView = o;
  $("selected").hidden = false;
  $("sel-name").textContent = o.name;
  $("sel-text").textContent = o.text;
  const ownerName = o.owner === state.account ? "you" : (state.byId.get(ownerAvatar(o.owner)) || {}).name;
  $("sel-meta").replaceChildren(`id ${o.id} · ${o.body || "?"}${o.avatar ? " · avatar" : ""} · owner ${ownerName ? ownerName + " " : ""}${short(o.owner)}`, copyButton(o.owner));
  const mine = o.owner === state.account && !o.avatar;
  $("edit-form").hidden = !mine;
  if (mine) {
    $("edit-name").value = o.name; $("edit-text").value = o.text; $("edit-body").value = o.body || "static";
    $("edit-color").value = "#" + o.color.slice(0, 6);
  }
  $("fork").hidden = !o.script;
  $("new-script").hidden = !mine || !!o.script;
  const box = $("script");
  box.replaceChildren();
  if (o.script) {
    const meta = document.createElement("p");
    meta.textContent = `licence ${o.script.licence} · author ${short(o.script.author)} · ${o.script.derived_from ? "derived from " + short(o.script.derived_from) : "original"} · script ${short(o.script.id)} `;
    meta.append(copyButton(o.script.id));
    const pre = document.createElement("pre");
    pre.textContent = o.script.source;
    const chain = document.createElement("p");
    chain.className = "provenance";
    box.append(meta, chain, pre);
    if (o.script.derived_from) provenance(o.script.derived_from).then((t) => { chain.textContent = t; });
  }
  state.dirty = true;
}

// The avatar of an account, if it is in view.
function ownerAvatar(account) {
  for (const o of state.objects) if (o.avatar && o.owner === account) return o.id;
  return null;
}

// A script's provenance back to the original, from the scripts the sim holds (16 steps at most).
async function provenance(id) {
  const steps = [];
  while (id && steps.length < 16) {
    const r = await fetch(`/v1/scripts/${id}`);
    if (!r.ok) { steps.push(`${id.slice(0, 12)}… (not held here)`); return "provenance: " + steps.join(" ← "); }
    const s = await r.json();
    steps.push(`${id.slice(0, 12)}… by ${s.author.slice(0, 8)}…`);
    id = s.derived_from;
  }
  return "provenance: " + steps.concat(id ? ["…"] : ["the original"]).join(" ← ");
}

// ---- building ----
const FORK_HEADER = "// metatopia: derived from script ";
const mineObjects = () => state.objects.filter((o) => o.owner === state.account && !o.avatar);

// The script editor: a fork of a script (its header names the original) or a new one.
function openEditor(source, origin) {
  $("editor").hidden = false;
  $("ed-source").value = source;
  $("ed-origin").textContent = origin ? `derived from ${origin.slice(0, 16)}…` : "a new script";
  $("ed-error").textContent = ""; delete $("ed-error").dataset.line;
  const sel = $("ed-target"), keep = sel.value;
  sel.replaceChildren(...mineObjects().map((o) => { const op = document.createElement("option"); op.value = o.id; op.textContent = `${o.name} (${o.id})`; return op; }));
  if (keep && Array.from(sel.options).some((op) => op.value === keep)) sel.value = keep;
  if (state.selected && mineObjects().some((o) => o.id === state.selected)) sel.value = state.selected;
}

async function deploy() {
  const source = $("ed-source").value, object = $("ed-target").value;
  if (!object) return notice("rez an object of your own first: scripts go on objects you own");
  const first = source.split("\n")[0];
  const derived_from = first.startsWith(FORK_HEADER) ? first.slice(FORK_HEADER.length).split(/\s/)[0] : null;
  const o = await act({ kind: "DeployScript", object, source, licence: $("ed-licence").value, derived_from });
  const err = $("ed-error");
  if (o && o.refused) {
    err.textContent = o.refused.reason;
    const m = o.refused.reason.match(/line (\d+)/);
    if (m) {
      // Select the line the error names in the editor.
      err.dataset.line = m[1];
      const lines = source.split("\n"), n = Math.min(+m[1], lines.length) - 1;
      const start = lines.slice(0, n).reduce((a, l) => a + l.length + 1, 0);
      $("ed-source").focus(); $("ed-source").setSelectionRange(start, start + lines[n].length);
    } else delete err.dataset.line;
  } else if (o) {
    err.textContent = `deployed at tick ${o.executed ? o.executed.tick : "?"}`; delete err.dataset.line;
    select(object);
  }
}

function setupBuild() {
  $("rez-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const me = state.avatar && state.byId.get(state.avatar);
    const name = $("rez-name").value.trim();
    if (!me || !name) return notice(me ? "name the object first" : "log in first");
    act({ kind: "Rez", name, shape: { box: [0.5, 0.5] }, at: [+me.position[0] + 2, +me.position[1]], color: 0x808080ff, text: "", body: "static" })
      .catch((err) => notice(String(err.message || err)));
    $("rez-name").value = "";
  });
  $("edit-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if (!state.selected) return;
    const o = state.selectedView || {};
    const edit = {};
    if ($("edit-name").value.trim() && $("edit-name").value.trim() !== o.name) edit.name = $("edit-name").value.trim();
    if ($("edit-text").value !== o.text) edit.text = $("edit-text").value;
    const rgb = $("edit-color").value.slice(1);
    if (rgb !== o.color.slice(0, 6)) edit.color = parseInt(rgb + o.color.slice(6, 8), 16) >>> 0;
    if ($("edit-body").value !== o.body) edit.body = $("edit-body").value;
    if (!Object.keys(edit).length) return notice("nothing to change");
    const id = state.selected;
    act({ kind: "Edit", object: id, edit }).then(() => select(id)).catch((err) => notice(String(err.message || err)));
  });
  $("fork").addEventListener("click", () => {
    const o = state.selectedView;
    if (!o || !o.script) return;
    openEditor(`${FORK_HEADER}${o.script.id} (${o.name})\n${o.script.source}`, o.script.id);
  });
  $("new-script").addEventListener("click", () => openEditor("fn on_touch(who) {\n    set_text(\"touched\");\n}\n", null));
  $("ed-deploy").addEventListener("click", () => deploy().catch((err) => notice(String(err.message || err))));
  $("ed-close").addEventListener("click", () => { $("editor").hidden = true; });
}

// ---- the own avatar (drawn by draw.js) ----
// The fastest the drawn avatar eases onto its committed position, in metres a second (the walk
// is 3 m/s).
const EASE_MAX_SPEED = 4;
// Where to draw the own avatar at `now`: while a walk is predicted, where it will be once its
// input is executed (from where it was drawn at the key press, at the walk's velocity and the
// sim's pace); then, once the committed state has caught up (stopped after the release), eased
// onto the committed position. A collision the prediction did not know of is corrected the same
// way.
function ownPosition(o, now) {
  const committed = [+o.position[0], +o.position[1]];
  const p = state.pred;
  let target = committed;
  if (p) {
    // Walked at the sim's pace: a sim below real time (its dilation) walks the avatar slower.
    const upto = Math.min(now, p.until ?? now);
    if (upto > p.last) {
      const t = ((upto - p.last) / 1000) * Math.min(1, Math.max(0.1, (state.status && state.status.dilation) || 1));
      p.at = [p.at[0] + p.vel[0] * t, p.at[1] + p.vel[1] * t];
      p.last = upto;
    }
    target = p.at;
    // Done once the sim has executed the walk and then its stop (a loaded node may execute the
    // walk after the key was released: its committed state at rest then is the walk not yet
    // begun); or 3 s after the release, if the walk never ran (refused, say).
    const stopped = !o.base || (o.base.vel[0] === 0 && o.base.vel[1] === 0);
    if (!stopped) p.seenMoving = true;
    if (p.until != null && ((p.seenMoving && stopped && now - p.until > 250) || now - p.until > 3000)) state.pred = null;
  }
  const d = state.drawnFor === o.id ? state.drawn : null;
  let at = target;
  if (!p && d) {
    // Ease: 15 % of the way a frame (about 150 ms to settle at 60 frames a second), but never
    // faster than a brisk walk: a sim that ran slower than the wall clock while the walk was
    // predicted (a loaded node, a dilated sim) leaves the prediction metres ahead, and the
    // avatar then walks back rather than jumping.
    const dx = (target[0] - d[0]) * 0.15;
    const dy = (target[1] - d[1]) * 0.15;
    const dt = Math.min(0.25, Math.max(0, now - (state.drawnTime ?? now)) / 1000);
    const most = Math.max(0.01, EASE_MAX_SPEED * dt);
    const k = Math.min(1, most / (Math.hypot(dx, dy) || 1));
    at = [d[0] + dx * k, d[1] + dy * k];
    if (Math.hypot(target[0] - at[0], target[1] - at[1]) < 0.005) at = target;
  }
  if (state.keyAt != null && d && (at[0] !== d[0] || at[1] !== d[1])) {
    window.metatopiaMoveLatency.push(now - state.keyAt);
    state.keyAt = null;
  }
  state.drawn = at;
  state.drawnFor = o.id;
  state.drawnTime = now;
  return at;
}

// Start (or stop, with a zero velocity) predicting the own avatar's walk.
function predictWalk(vel) {
  const now = performance.now();
  const me = state.avatar && state.byId.get(state.avatar);
  if (!me) return;
  const from = (state.drawnFor === me.id && state.drawn) || [+me.position[0], +me.position[1]];
  if (vel[0] === 0 && vel[1] === 0) {
    if (state.pred && state.pred.until == null) state.pred.until = now;
    return;
  }
  // A new walk starts where the avatar is drawn now (the last one's end, if it was one).
  state.pred = { vel, at: from, last: now, until: null };
  state.keyAt = now;
}

// The own avatar as drawn (and the frame time it was drawn for) and as committed, and whether a
// walk is being predicted (for tests).
window.metatopiaOwn = () => {
  const me = state.avatar && state.byId.get(state.avatar);
  return me && { drawn: state.drawn, drawnTime: state.drawnTime, committed: [+me.position[0], +me.position[1]], predicting: !!state.pred };
};

// Where an object was last drawn (world metres), and how many tick messages have come (for tests).
window.metatopiaDrawnOf = (id) => state.drawnAt.get(id) || null;
window.metatopiaTicksSeen = () => state.ticksSeen;

// What the map shows (for tests): its centre and zoom, and whether it follows the own avatar.
window.metatopiaView = () => ({ ...state.view, follow: $("follow").checked });

// Where an object is on the page (for tests driving the mouse).
window.metatopiaScreenOf = (id) => {
  const o = state.byId.get(id), c = $("map"), r = c.getBoundingClientRect();
  if (!o) return null;
  const { x, y, scale } = state.view;
  return [r.left + r.width / 2 + (+o.position[0] - x) * scale, r.top + r.height / 2 - (+o.position[1] - y) * scale];
};

function worldAt(ev) {
  const r = $("map").getBoundingClientRect();
  const { x, y, scale } = state.view;
  return [x + (ev.clientX - r.left - r.width / 2) / scale, y - (ev.clientY - r.top - r.height / 2) / scale];
}

const ZOOM = [0.5, 64];
function zoomBy(k) { state.view.scale = Math.min(ZOOM[1], Math.max(ZOOM[0], state.view.scale * k)); }

// Walking: the directions held (keys or the pad), summed, at 3 m/s; sent when they change.
const held = new Map();
let walking = [0, 0];
function walk() {
  if (!state.avatar) return;
  let vx = 0, vy = 0;
  for (const [dx, dy] of held.values()) { vx += dx; vy += dy; }
  const d = Math.hypot(vx, vy);
  const v = d ? [(vx / d) * 3, (vy / d) * 3] : [0, 0];
  if (v[0] === walking[0] && v[1] === walking[1]) return;
  walking = v;
  predictWalk(v);
  act({ kind: "Move", object: state.avatar, velocity: v }, performance.now()).catch((err) => notice(String(err.message || err)));
}

// Keys work wherever the focus is, except while typing in a field (Escape leaves it).
const typing = (e) => e.target instanceof Element && e.target.closest("input, textarea, select, [contenteditable]");
const KEYS = {
  ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, 1], ArrowDown: [0, -1],
  a: [-1, 0], d: [1, 0], w: [0, 1], s: [0, -1], A: [-1, 0], D: [1, 0], W: [0, 1], S: [0, -1],
};

function setupInput() {
  const c = $("map");
  c.addEventListener("wheel", (e) => { e.preventDefault(); zoomBy(e.deltaY < 0 ? 1.2 : 1 / 1.2); }, { passive: false });
  // Pointers (mouse, pen, touch): one drags (pans, or moves one's own selected object), two
  // pinch to zoom; a tap selects an object or walks there.
  const pointers = new Map();
  let pinch = null;
  c.addEventListener("pointerdown", (e) => {
    c.setPointerCapture(e.pointerId);
    c.focus({ preventScroll: true });
    pointers.set(e.pointerId, [e.clientX, e.clientY]);
    if (pointers.size === 2) {
      const [p, q] = Array.from(pointers.values());
      pinch = { dist: Math.hypot(p[0] - q[0], p[1] - q[1]) || 1, scale: state.view.scale };
      if (state.drag) state.drag.moved = true;
      return;
    }
    if (pointers.size > 2) return;
    const [wx, wy] = worldAt(e);
    const sel = state.selected && state.byId.get(state.selected);
    const grab = sel && sel.owner === state.account && !sel.avatar && Math.hypot(+sel.position[0] - wx, +sel.position[1] - wy) < 1.5;
    state.drag = { x: e.clientX, y: e.clientY, moved: false, object: grab ? sel.id : null };
  });
  c.addEventListener("pointermove", (e) => {
    if (!pointers.has(e.pointerId)) return;
    pointers.set(e.pointerId, [e.clientX, e.clientY]);
    if (pinch && pointers.size >= 2) {
      const [p, q] = Array.from(pointers.values());
      state.view.scale = Math.min(ZOOM[1], Math.max(ZOOM[0], (pinch.scale * Math.hypot(p[0] - q[0], p[1] - q[1])) / pinch.dist));
      return;
    }
    if (!state.drag) return;
    if (state.drag.object) { state.drag.moved = true; state.drag.to = worldAt(e); return; }
    const dx = e.clientX - state.drag.x, dy = e.clientY - state.drag.y;
    if (!state.drag.moved && Math.abs(dx) + Math.abs(dy) <= 4) return;
    if (!state.drag.moved) { state.drag.moved = true; $("follow").checked = false; }
    state.view.x -= dx / state.view.scale; state.view.y += dy / state.view.scale;
    state.drag.x = e.clientX; state.drag.y = e.clientY;
  });
  const release = (e) => {
    if (!pointers.delete(e.pointerId)) return;
    if (pinch) { if (pointers.size < 2) pinch = null; if (!pointers.size) state.drag = null; return; }
    const drag = state.drag; state.drag = null;
    if (e.type === "pointercancel" || !drag) return;
    tap(e, drag);
  };
  c.addEventListener("pointerup", release);
  c.addEventListener("pointercancel", release);
  document.addEventListener("keydown", (e) => {
    if (typing(e)) {
      if (e.key === "Escape") { e.target.blur(); c.focus({ preventScroll: true }); }
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === "Enter") { e.preventDefault(); $("chat-input").focus(); return; }
    if (e.key === "+" || e.key === "=") { zoomBy(1.25); return; }
    if (e.key === "-") { zoomBy(0.8); return; }
    const k = KEYS[e.key];
    if (!k || !state.avatar) return;
    e.preventDefault();
    if (e.repeat) return;
    held.set(e.key.toLowerCase(), k);
    walk();
  });
  document.addEventListener("keyup", (e) => {
    if (!KEYS[e.key]) return;
    if (held.delete(e.key.toLowerCase())) walk();
  });
  // A key released while the window had no focus would walk for ever.
  window.addEventListener("blur", () => { if (held.size) { held.clear(); walk(); } });
  for (const b of document.querySelectorAll("#pad button")) {
    const dir = b.dataset.dir.split(",").map(Number), name = `pad ${b.dataset.dir}`;
    b.addEventListener("pointerdown", (e) => { e.preventDefault(); b.setPointerCapture(e.pointerId); b.classList.add("on"); held.set(name, dir); walk(); });
    const up = () => { b.classList.remove("on"); if (held.delete(name)) walk(); };
    b.addEventListener("pointerup", up);
    b.addEventListener("pointercancel", up);
    b.addEventListener("lostpointercapture", up);
  }
  $("zoom-in").addEventListener("click", () => zoomBy(1.25));
  $("zoom-out").addEventListener("click", () => zoomBy(0.8));
  $("chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("chat-input");
    const said = parseChat(input.value, +$("chat-range").value);
    if (said) act({ kind: "Chat", ...said }).catch((err) => notice(String(err.message || err)));
    input.value = "";
  });
  $("obj-search").addEventListener("input", () => renderObjects());
  $("touch").addEventListener("click", () => state.selected && act({ kind: "Touch", object: state.selected }));
  $("name-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const name = $("name-input").value.trim();
    if (!name) return;
    localStorage.setItem("metatopia-name", name);
    login().catch((err) => notice(String(err.message || err)));
  });
  $("logout").addEventListener("click", () => logout().catch((err) => notice(String(err.message || err))));
}

// What the chat box says: `/w text` whispers (10 m), `/s text` shouts (100 m), `/N text` says
// it on channel N (scripts listen there); otherwise at the range chosen beside the box.
function parseChat(line, range) {
  let text = line.trim(), channel = 0;
  const cmd = text.match(/^\/(w|whisper|s|shout|say|-?\d+)\s+([\s\S]*)$/i);
  if (cmd) {
    const c = cmd[1].toLowerCase();
    if (c === "w" || c === "whisper") range = RANGE.whisper;
    else if (c === "s" || c === "shout") range = RANGE.shout;
    else if (c === "say") range = RANGE.say;
    else channel = +c;
    text = cmd[2].trim();
  }
  return text ? { channel, range, text } : null;
}

// A tap or click that did not drag: on one's own dragged object, move it there; on an object,
// select it; on the ground, walk there (3 m/s, for the distance).
function tap(e, drag) {
  if (drag.object && drag.moved) {
    const to = worldAt(e), id = drag.object;
    act({ kind: "Edit", object: id, edit: { at: to } }).then(() => select(id)).catch((err) => notice(String(err.message || err)));
    return;
  }
  if (drag.moved) return;
  const [wx, wy] = worldAt(e);
  let best = null, bd = Math.max(1.5, 12 / state.view.scale);
  for (const o of state.objects) {
    const at = state.drawnAt.get(o.id) || [+o.position[0], +o.position[1]];
    const d = Math.hypot(at[0] - wx, at[1] - wy);
    if (d < bd) { bd = d; best = o; }
  }
  if (best && best.id !== state.avatar) return select(best.id);
  const me = state.avatar && state.byId.get(state.avatar);
  if (!me) return;
  const dx = wx - me.position[0], dy = wy - me.position[1], d = Math.hypot(dx, dy) || 1;
  const v = [(dx / d) * 3, (dy / d) * 3];
  predictWalk(v);
  act({ kind: "Move", object: state.avatar, velocity: v });
  setTimeout(() => { predictWalk([0, 0]); act({ kind: "Move", object: state.avatar, velocity: [0, 0] }); }, (d / 3) * 1000);
}

// The name form: shown to a visitor without a name, and after logging out.
function askName() {
  // Shown already (a reconnect, a move to a nearer node): what the visitor typed stays.
  if (!$("name-form").hidden) return;
  $("name-input").value = localStorage.getItem("metatopia-name") || `visitor-${state.account.slice(0, 4)}`;
  $("name-form").hidden = false;
  $("logout").hidden = true;
}

async function login() {
  state.name = localStorage.getItem("metatopia-name") || `visitor-${state.account.slice(0, 4)}`;
  const o = await act({ kind: "Login", name: state.name });
  const acct = await request("account", state.account);
  if (acct && acct.avatar) {
    state.avatar = acct.avatar;
    $("me").textContent = `${state.name} (${state.account.slice(0, 8)}…, ${state.signer})`;
    $("me").dataset.signer = state.signer;
    $("me").dataset.loggedIn = "true";
    $("name-form").hidden = true;
    $("logout").hidden = false;
    $("build").hidden = false;
  } else {
    notice(`login: ${o ? JSON.stringify(o) : "no answer"}`);
    askName();
  }
}

async function logout() {
  const o = await act({ kind: "Logout" });
  if (o && !o.refused) {
    state.avatar = null;
    $("me").textContent = "logged out";
    $("me").dataset.loggedIn = "false";
    $("build").hidden = true;
    askName();
  }
}

// A session lasts while the viewer logs in again now and then (every 20 s; the sim removes an
// avatar a minute after its last login, so a closed tab leaves no avatar behind).
const SESSION_REFRESH_MS = 20000;
function refreshSession() {
  if (state.avatar && ws && ws.readyState === 1) act({ kind: "Login", name: state.name }).catch(() => {});
}

async function main() {
  setupInput();
  setupBuild();
  setupMinimap();
  requestAnimationFrame(draw);
  setInterval(renderObjects, 250);
  try { await loadKey(); } catch (e) { notice(`cannot sign: ${e.message || e}`); }
  connect();
  setInterval(() => { if (ws && ws.readyState === 1) ping().catch(() => {}); }, 2000);
  setInterval(refreshSession, SESSION_REFRESH_MS);
  // Who governs the sim can change (a temp admin), and neighbours come and go: asked again now
  // and then.
  setInterval(() => {
    if (!ws || ws.readyState !== 1) return;
    ws.send(JSON.stringify({ governance: {} }));
    findNeighbours();
  }, 30000);
}

main();
