// SPDX-License-Identifier: AGPL-3.0-or-later
// One world, not one sim (loaded before viewer.js, whose `state`, `ws` and handlers it uses):
// the sims around the current one are found through the node (`enter` at a point beyond each
// edge and corner answers with the sim whose square holds it, through Raynet) and watched on a
// socket of their own to one of their nodes, so the map draws them around this one. When the
// own avatar crosses a border it appears in the neighbour's view: that view becomes this sim's
// at once (its socket, objects and status were already there), and the old one a neighbour's;
// no frame goes without the world drawn. Meanwhile the avatar is drawn where it was predicted.
"use strict";

// An account with no avatar anywhere: `enter` with it asks which sim holds a point.
const NOBODY = "0".repeat(64);
const NEIGHBOURS_MAX = 8;
const neighbours = new Map(); // sim → its view: { sim, http, nodes, ws, status, byId, objects, drawnAt, tick, tickAt }

// `route` answers come in the order asked (a session's messages are answered one at a time).
let routeWaiters = [];
function askRoute(msg) {
  return new Promise((resolve) => {
    if (!ws || ws.readyState !== 1) return resolve(null);
    routeWaiters.push(resolve);
    ws.send(JSON.stringify(msg));
  });
}
// A new socket: answers to the old one's questions will not come.
function routesLost() {
  for (const w of routeWaiters) w(null);
  routeWaiters = [];
}

let finding = false;
// While no neighbour is found the search comes again soon, then less often (2, 4, 8, 16 s, then
// every 30 s with the viewer's other refreshes): right after a world starts its overlay may not
// know the other sims yet, and the node then answers with its own sim.
let retryMs = 2000, retry = null;
// Ask which sims hold the points beyond each edge and corner of this sim's square; watch each
// new one, and stop watching those no longer next to this sim.
async function findNeighbours() {
  const s = state.status;
  if (!s || finding) return;
  finding = true;
  clearTimeout(retry);
  retry = null;
  try {
    const [ox, oy] = s.region_origin, size = s.region_size, found = new Set();
    for (const [dx, dy] of [[1, 0], [-1, 0], [0, 1], [0, -1], [1, 1], [-1, 1], [1, -1], [-1, -1]]) {
      const at = [Math.floor(ox + size / 2 + dx * size), Math.floor(oy + size / 2 + dy * size)];
      const m = await askRoute({ enter: { account: NOBODY, at } });
      if (!m || state.status !== s) return;
      if (m.sim === s.sim) continue;
      found.add(m.sim);
      if (!neighbours.has(m.sim) && neighbours.size < NEIGHBOURS_MAX) watch(m.sim, m.nodes);
    }
    for (const [sim, nb] of neighbours) if (!found.has(sim)) unwatch(nb);
  } finally {
    finding = false;
    if (neighbours.size) {
      retryMs = 2000;
    } else if (retryMs < 30000) {
      retry = setTimeout(findNeighbours, retryMs);
      retryMs *= 2;
    }
  }
}

// A socket to one of a neighbour's nodes (spread over them by account), read for its status and
// objects; reopened by the next search if it closes.
function watch(sim, nodes) {
  const usable = nodes.filter((n) => n.http);
  if (!usable.length) return;
  const hash = parseInt((state.account || "0").slice(0, 8), 16) || 0;
  const node = usable[hash % usable.length];
  const nb = { sim, http: node.http, nodes: usable, status: null, byId: new Map(), objects: [], drawnAt: new Map(), tick: 0, tickAt: null };
  nb.ws = new WebSocket(`${scheme}://${node.http}/v1/ws`);
  nb.ws.onmessage = (e) => neighbourMessage(nb, JSON.parse(e.data));
  nb.ws.onclose = () => { if (neighbours.get(sim) === nb) neighbours.delete(sim); };
  neighbours.set(sim, nb);
}

function unwatch(nb) {
  neighbours.delete(nb.sim);
  nb.ws.onclose = null;
  nb.ws.close();
}

function neighbourMessage(nb, msg) {
  const [type, m] = Object.entries(msg)[0];
  switch (type) {
    case "status": nb.status = m; break;
    case "tick":
      applyTick(nb, m);
      // The own avatar arrived here: this is the avatar's sim now.
      if (state.account && m.enter.some((o) => o.avatar && o.owner === state.account)) crossTo(nb);
      break;
    // Answers to what was asked on this socket while it was this sim's (a crossing since).
    case "submitted": case "outcome": case "error": case "object": case "account": handle(msg); break;
  }
}

// Swap: the neighbour's view becomes this sim's, this sim's a neighbour's.
function crossTo(nb) {
  const me = nb.objects.find((o) => o.avatar && o.owner === state.account);
  const old = {
    sim: state.status.sim, http: wsHost, nodes: near.nodes, ws, status: state.status,
    byId: state.byId, objects: state.objects, drawnAt: state.drawnAt, tick: state.tick, tickAt: state.tickAt,
  };
  neighbours.delete(nb.sim);
  ws.onmessage = (e) => neighbourMessage(old, JSON.parse(e.data));
  ws.onclose = () => { if (neighbours.get(old.sim) === old) neighbours.delete(old.sim); };
  neighbours.set(old.sim, old);
  routesLost();
  ws = nb.ws;
  ws.onmessage = (e) => handle(JSON.parse(e.data));
  ws.onclose = mainClosed;
  wsHost = nb.http;
  document.body.dataset.node = wsHost;
  Object.assign(state, { byId: nb.byId, objects: nb.objects, drawnAt: nb.drawnAt, tick: nb.tick, tickAt: nb.tickAt });
  state.avatar = me.id;
  state.ghost = null;
  state.crossings = (state.crossings || 0) + 1;
  state.placeSim = nb.sim;
  state.dirty = true;
  if (nb.status) applyStatus(nb.status);
  state.governance = null;
  ws.send(JSON.stringify({ governance: {} }));
  near.nodes = nb.nodes;
  measureNodes();
  findNeighbours();
}

// The own avatar left this sim (crossing a border, most likely): it is drawn where predicted
// until it appears in the neighbour's view. If it appears nowhere in 3 s (no neighbour watched
// there), the viewer asks where it is and goes there.
function leftSim() {
  const o = state.byId.get(state.avatar);
  if (o) state.ghost = o;
  const sim = state.status && state.status.sim, crossed = state.crossings || 0;
  setTimeout(async () => {
    if ((state.crossings || 0) !== crossed || !state.status || state.status.sim !== sim) return;
    const m = await askRoute({ route: { account: state.account } });
    if (!m || m.sim === sim) return;
    state.ghost = null;
    near.nodes = m.nodes.filter((n) => n.http);
    // Its new node logs in again on opening (the avatar is there: no second one).
    if (near.nodes[0]) { state.avatar = null; moveTo(near.nodes[0].http); }
  }, 3000);
}

// The sims drawn around this one (for tests): their numbers and how many objects each shows.
window.metatopiaWorld = () => ({
  sim: state.status && state.status.sim,
  crossings: state.crossings || 0,
  neighbours: Array.from(neighbours.values(), (nb) => ({ sim: nb.sim, objects: nb.objects.length, ground: !!nb.status })),
});
