// A plan's dependency graph (/board/graph/?root=<id> or ?tag=<tag>: templates/board/graph.html).
// The server answers the tasks and their dependencies (/board/graph/data, board/live/graph.py);
// this lays them out with the browser alone, no library: a layered drawing (Sugiyama's method,
// simplified), which a plan's DAG suits and which stays readable at 500 tasks:
//   1. layers: a task one column right of its latest dependency (longest path from the sources);
//   2. order within a column: a few sweeps placing each task at the mean position of its
//      neighbours in the column before (then after), which untangles most crossings;
//   3. edges as curves from a dependency's right side to the waiting task's left side.
// The critical path is the longest chain of unfinished tasks (the steps still to go, whatever
// their durations, which the board does not know ahead); a click on a task marks what blocks it
// (its unfinished dependencies, down the chain). Zoom with the wheel or the buttons, pan by
// dragging. The data is read again every POLL_MS while the page is visible: stages recolour in
// place, a changed plan is laid out again (the view keeps its zoom).

import { loadPlan } from "./api.js";
import { showMessage } from "./page.js";

const POLL_MS = 3000;
const W = 180; // a task's box
const H = 40;
const GAP_X = 70;
const GAP_Y = 14;
const SWEEPS = 4;
const UNFINISHED = (stage) => stage !== "COMPLETED" && stage !== "CANCELLED";
const SVG = "http://www.w3.org/2000/svg";

const root = document.getElementById("graph-page");
const svg = root.querySelector("svg.graph");
const world = root.querySelector(".graph-world");
const query = root.dataset.root ? `root=${encodeURIComponent(root.dataset.root)}` : `tag=${encodeURIComponent(root.dataset.tag)}`;

let plan = null; // {nodes: Map id -> node, edges: [[task, dep]], preds, succs, shapeKey}
let view = { k: 1, x: 20, y: 20 };
let selected = null;
let fitted = false;

function make(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) e.setAttribute(name, value);
  if (text !== undefined) e.textContent = text;
  return e;
}

function cut(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

// -- layout ------------------------------------------------------------------------------------

/** Layers and positions: node.layer, node.x, node.y for every node of `p`. */
function layout(p) {
  const order = [];
  const missing = new Map([...p.nodes.keys()].map((id) => [id, p.preds.get(id).length]));
  const ready = [...p.nodes.keys()].filter((id) => missing.get(id) === 0);
  for (const id of p.nodes.keys()) p.nodes.get(id).layer = 0;
  while (ready.length) {
    const id = ready.shift();
    order.push(id);
    for (const next of p.succs.get(id)) {
      const n = p.nodes.get(next);
      n.layer = Math.max(n.layer, p.nodes.get(id).layer + 1);
      missing.set(next, missing.get(next) - 1);
      if (missing.get(next) === 0) ready.push(next);
    }
  }
  p.order = order.length === p.nodes.size ? order : [...p.nodes.keys()]; // (a cycle: check() says so)
  const layers = [];
  for (const id of p.order) (layers[p.nodes.get(id).layer] ||= []).push(id);
  const place = () => layers.forEach((ids) => ids.forEach((id, i) => { p.nodes.get(id).pos = i; }));
  place();
  const mean = (ids) => (ids.length ? ids.reduce((sum, id) => sum + p.nodes.get(id).pos, 0) / ids.length : null);
  for (let sweep = 0; sweep < SWEEPS; sweep++) {
    const down = sweep % 2 === 0;
    const range = down ? layers.map((_, i) => i).slice(1) : layers.map((_, i) => i).reverse().slice(1);
    for (const l of range) {
      const key = new Map(layers[l].map((id) => [id, mean(down ? p.preds.get(id) : p.succs.get(id))]));
      layers[l].sort((a, b) => (key.get(a) ?? p.nodes.get(a).pos) - (key.get(b) ?? p.nodes.get(b).pos));
      place();
    }
  }
  const tallest = Math.max(...layers.map((ids) => ids.length));
  layers.forEach((ids, l) => {
    const offset = ((tallest - ids.length) * (H + GAP_Y)) / 2;
    ids.forEach((id, i) => {
      const n = p.nodes.get(id);
      n.x = l * (W + GAP_X);
      n.y = offset + i * (H + GAP_Y);
    });
  });
  p.width = layers.length * (W + GAP_X) - GAP_X;
  p.height = tallest * (H + GAP_Y) - GAP_Y;
}

/** The longest chain of unfinished tasks, as a set of ids and a set of "dep>task" edge keys. */
function criticalPath(p) {
  const best = new Map();
  const from = new Map();
  for (const id of p.order) {
    if (!UNFINISHED(p.nodes.get(id).stage)) continue;
    let length = 1;
    let via = null;
    for (const dep of p.preds.get(id)) {
      if (best.has(dep) && best.get(dep) + 1 > length) {
        length = best.get(dep) + 1;
        via = dep;
      }
    }
    best.set(id, length);
    from.set(id, via);
  }
  const nodes = new Set();
  const edges = new Set();
  let end = null;
  for (const [id, length] of best) if (end === null || length > best.get(end)) end = id;
  if (end === null || best.get(end) < 2) return { nodes, edges }; // one task is no path
  for (let id = end; id !== null; id = from.get(id)) {
    nodes.add(id);
    if (from.get(id) !== null) edges.add(`${from.get(id)}>${id}`);
  }
  return { nodes, edges };
}

/** The unfinished tasks `id` waits for, down the chain. */
function blockersOf(p, id) {
  const found = new Set();
  const todo = [id];
  while (todo.length) {
    for (const dep of p.preds.get(todo.pop())) {
      if (found.has(dep) || !UNFINISHED(p.nodes.get(dep).stage)) continue;
      found.add(dep);
      todo.push(dep);
    }
  }
  return found;
}

// -- drawing -----------------------------------------------------------------------------------

function draw(p) {
  const edges = make("g", { class: "edges" });
  for (const [task, dep] of p.edges) {
    const a = p.nodes.get(dep);
    const b = p.nodes.get(task);
    const x1 = a.x + W;
    const y1 = a.y + H / 2;
    const x2 = b.x;
    const y2 = b.y + H / 2;
    const mid = (x1 + x2) / 2;
    const path = make("path", { class: "edge", d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2 - 4},${y2}`, "marker-end": "url(#arrow)" });
    path.dataset.key = `${dep}>${task}`;
    edges.append(path);
  }
  const nodes = make("g", { class: "nodes" });
  for (const n of p.nodes.values()) {
    const g = make("g", { class: `node${n.id === root.dataset.root ? " root" : ""}`, transform: `translate(${n.x},${n.y})` });
    g.dataset.id = n.id;
    g.append(make("title", {}, `${n.id}: ${n.title}`));
    g.append(make("rect", { width: W, height: H }));
    g.append(make("text", { x: 8, y: 16, class: "node-title" }, cut(`${n.id} · ${n.title}`, 27)));
    g.append(make("text", { x: 8, y: 32, class: "node-stage" }));
    nodes.append(g);
  }
  const defs = make("defs");
  const marker = make("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 8, markerHeight: 8,
    markerUnits: "userSpaceOnUse", orient: "auto" });
  marker.append(make("path", { d: "M0,0 L10,5 L0,10 z", fill: "currentColor" }));
  defs.append(marker);
  world.replaceChildren(defs, edges, nodes);
  paint(p);
}

/** Stages, owners, the critical path and the selection, on the drawn graph. */
function paint(p) {
  const critical = criticalPath(p);
  const blockers = selected && p.nodes.has(selected) ? blockersOf(p, selected) : new Set();
  for (const g of world.querySelectorAll(".node")) {
    const n = p.nodes.get(g.dataset.id);
    g.dataset.stage = n.stage;
    g.querySelector(".node-stage").textContent = cut(`${n.stage}${n.owner ? ` · ${n.owner}` : ""}` +
      (n.attempts > 1 ? ` · attempt ${n.attempts}` : ""), 30);
    g.classList.toggle("critical", critical.nodes.has(n.id));
    g.classList.toggle("blocker", blockers.has(n.id));
    g.classList.toggle("selected", n.id === selected);
  }
  for (const path of world.querySelectorAll(".edge")) {
    const [dep, task] = path.dataset.key.split(">");
    path.classList.toggle("critical", critical.edges.has(path.dataset.key));
    path.classList.toggle("blocking", blockers.has(dep) && (task === selected || blockers.has(task)));
  }
  const counts = {};
  for (const n of p.nodes.values()) counts[n.stage] = (counts[n.stage] || 0) + 1;
  root.querySelector(".graph-summary").textContent = `${p.nodes.size} tasks · ${p.edges.length} dependencies · ` +
    Object.entries(counts).map(([stage, n]) => `${stage} ${n}`).join(", ") +
    (p.complete ? "" : ` (the first ${root.dataset.maxNodes} of a larger plan)`) +
    (critical.nodes.size ? ` · critical path: ${critical.nodes.size} tasks` : "");
  const said = root.querySelector(".graph-selected");
  if (selected && p.nodes.has(selected)) {
    const names = [...blockers].slice(0, 20).map((id) => `${id} (${p.nodes.get(id).stage})`);
    said.textContent = blockers.size ? `${selected} waits on ${names.join(", ")}${blockers.size > 20 ? ` and ${blockers.size - 20} more` : ""}`
      : `${selected} waits on nothing unfinished`;
  } else {
    said.textContent = "";
  }
}

// -- zoom and pan ------------------------------------------------------------------------------

function apply() {
  world.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
}

function fit() {
  if (!plan) return;
  const box = svg.getBoundingClientRect();
  const k = Math.min(1, Math.max(0.05, Math.min((box.width - 40) / Math.max(plan.width, 1), (box.height - 40) / Math.max(plan.height, 1))));
  view = { k, x: (box.width - plan.width * k) / 2, y: (box.height - plan.height * k) / 2 };
  apply();
}

function zoom(factor, cx, cy) {
  const k = Math.min(4, Math.max(0.05, view.k * factor));
  view = { k, x: cx - ((cx - view.x) * k) / view.k, y: cy - ((cy - view.y) * k) / view.k };
  apply();
}

svg.addEventListener("wheel", (event) => {
  event.preventDefault();
  const box = svg.getBoundingClientRect();
  zoom(event.deltaY < 0 ? 1.15 : 1 / 1.15, event.clientX - box.left, event.clientY - box.top);
}, { passive: false });

let drag = null;
svg.addEventListener("pointerdown", (event) => {
  drag = { x: event.clientX, y: event.clientY, vx: view.x, vy: view.y, moved: false };
  svg.setPointerCapture(event.pointerId);
});
svg.addEventListener("pointermove", (event) => {
  if (!drag) return;
  const dx = event.clientX - drag.x;
  const dy = event.clientY - drag.y;
  if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
  if (!drag.moved) return;
  svg.classList.add("panning");
  view = { ...view, x: drag.vx + dx, y: drag.vy + dy };
  apply();
});
svg.addEventListener("pointerup", (event) => {
  const click = drag && !drag.moved;
  drag = null;
  svg.classList.remove("panning");
  if (!click || !plan) return;
  const node = document.elementFromPoint(event.clientX, event.clientY)?.closest(".node");
  selected = node ? node.dataset.id : null;
  paint(plan);
});
svg.addEventListener("dblclick", (event) => {
  // (Not event.target: the pointer is captured by the svg for panning.)
  const node = document.elementFromPoint(event.clientX, event.clientY)?.closest(".node");
  if (node) window.location.assign(`/board/task/${encodeURIComponent(node.dataset.id)}`);
});
root.querySelector(".graph-fit").addEventListener("click", fit);
root.querySelector(".graph-zoom-in").addEventListener("click", () => {
  const box = svg.getBoundingClientRect();
  zoom(1.25, box.width / 2, box.height / 2);
});
root.querySelector(".graph-zoom-out").addEventListener("click", () => {
  const box = svg.getBoundingClientRect();
  zoom(1 / 1.25, box.width / 2, box.height / 2);
});

// -- the data ------------------------------------------------------------------------------------

function planOf(data) {
  const nodes = new Map(data.nodes.map((n) => [n.id, { ...n }]));
  const preds = new Map([...nodes.keys()].map((id) => [id, []]));
  const succs = new Map([...nodes.keys()].map((id) => [id, []]));
  for (const [task, dep] of data.edges) {
    preds.get(task).push(dep);
    succs.get(dep).push(task);
  }
  const shapeKey = `${[...nodes.keys()].sort().join(",")}|${data.edges.map((e) => e.join(">")).sort().join(",")}`;
  return { nodes, edges: data.edges, preds, succs, shapeKey, complete: data.complete };
}

async function load() {
  let data;
  try {
    data = await loadPlan(query);
  } catch (err) {
    showMessage(`could not read the plan: ${err.message || err}`, "error");
    return;
  }
  const next = planOf(data);
  if (plan && plan.shapeKey === next.shapeKey) {
    // The same plan: its tasks moved on. Recolour in place (positions stay).
    for (const [id, n] of next.nodes) Object.assign(plan.nodes.get(id), { stage: n.stage, owner: n.owner, attempts: n.attempts });
    plan.complete = next.complete;
    paint(plan);
    return;
  }
  plan = next;
  layout(plan);
  draw(plan);
  if (!fitted) {
    fit();
    fitted = true;
  }
  // For the tests: drawn, with this many tasks, this long after the page's start (ms).
  root.dataset.drawnMs = String(Math.round(performance.now()));
  root.dataset.drawn = String(plan.nodes.size);
}

load();
setInterval(() => { if (!document.hidden) load(); }, POLL_MS);
