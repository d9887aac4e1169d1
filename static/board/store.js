// The page's model of the board: every task it knows (as the server last sent it), the order
// of each column, the count of each stage, who waits for whom, the problems. Nothing here
// touches the DOM: a change is announced to the listeners of `onChange` (render.js redraws
// those cards on the next frame).
//
// What it is fed: the snapshot (`applySnapshot`, socket.js), changed tasks from the socket and
// from the API's answers (`applyTask`), tasks the prune deleted (`removeTask`, socket.js), older
// finished tasks from the API (`loadOlder`, "show more"), the stage of dependencies not on the
// board (fetched by `depDone`).
//
// One rule keeps it right whatever order things arrive in: a task replaces the one shown only
// when its version is newer. A task as the server sends it (the API's task; the socket's cards
// leave out description, payload, checkpoint and result) gets its times parsed once, in
// milliseconds since the epoch: createdMs, updatedMs, leaseExpiresMs (null without a lease),
// inStageSinceMs (when it entered its stage).

import { STAGES, TERMINAL } from "./page.js";

export const tasks = new Map(); // id -> task
const dependents = new Map(); // dependency id -> Set of ids of the tasks that wait for it
export const order = new Map(STAGES.map((s) => [s, []])); // stage -> ids in display order
export const counts = Object.fromEntries(STAGES.map((s) => [s, 0])); // stage -> tasks in it (all, not only those loaded)
export const showMoreCursor = new Map(); // terminal stage -> API cursor, or null once everything was loaded
const olderTerminal = new Map(); // finished tasks loaded by "show more" or a link (kept over snapshots)
const depInfo = new Map(); // id -> {stage} of dependencies not on the board (fetched)
let problems = [];
let snapshotsApplied = 0;

const listeners = [];

/** `listener(ids, countsChanged)` is called with the ids of the tasks whose cards must be
 * redrawn (a task that changed, and the tasks that wait for it). */
export function onChange(listener) {
  listeners.push(listener);
}

function changed(ids, countsChanged) {
  for (const listener of listeners) listener(ids, countsChanged);
}

export function getProblems() {
  return problems;
}

export function setProblems(list) {
  problems = list;
}

/** How many snapshots the page has applied since it was loaded (0: it shows nothing yet). */
export function snapshotCount() {
  return snapshotsApplied;
}

// ------------------------------------------------------------------------------------------
// Tasks as they arrive

function parseTime(value) {
  if (!value) return null;
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

export function prepare(task) {
  task.createdMs = parseTime(task.created_at) || 0;
  task.updatedMs = parseTime(task.updated_at) || 0;
  task.leaseExpiresMs = parseTime(task.lease_expires_at);
  task.inStageSinceMs = parseTime(task.stage_changed_at) || task.updatedMs;
  return task;
}

// Display order: live stages as the server lists them (priority, then age, then id); terminal
// stages most recent first.
function compare(a, b) {
  if (TERMINAL.has(a.stage)) {
    if (a.updatedMs !== b.updatedMs) return b.updatedMs - a.updatedMs;
    return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
  }
  if (a.priority !== b.priority) return b.priority - a.priority;
  if (a.createdMs !== b.createdMs) return a.createdMs - b.createdMs;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

/** Index of the first id in `ids` that `task` sorts before (binary search). */
export function positionOf(ids, task) {
  let lo = 0;
  let hi = ids.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    const other = tasks.get(ids[mid]);
    if (other.id === task.id || compare(task, other) < 0) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

function removeFromOrder(task) {
  const ids = order.get(task.stage);
  if (!ids) return;
  let i = positionOf(ids, task);
  if (ids[i] !== task.id) i = ids.indexOf(task.id); // its key changed under us: search
  if (i >= 0) ids.splice(i, 1);
}

function insertIntoOrder(task) {
  const ids = order.get(task.stage);
  if (!ids) return;
  ids.splice(positionOf(ids, task), 0, task.id);
}

function linkDeps(task) {
  for (const dep of task.deps || []) {
    let set = dependents.get(dep);
    if (!set) dependents.set(dep, (set = new Set()));
    set.add(task.id);
  }
}

/** Replace everything with the snapshot's board (the finished tasks loaded on demand stay). */
export function applySnapshot(snap) {
  snapshotsApplied++;
  tasks.clear();
  dependents.clear();
  for (const s of STAGES) {
    order.set(s, []);
    counts[s] = snap.counts[s] || 0;
  }
  for (const task of snap.tasks) {
    prepare(task);
    tasks.set(task.id, task);
    order.get(task.stage)?.push(task.id);
    linkDeps(task);
  }
  // The server sends them in this order; sorting here too keeps the binary searches exact
  // (times are compared in milliseconds here).
  for (const ids of order.values()) ids.sort((a, b) => compare(tasks.get(a), tasks.get(b)));
  for (const task of olderTerminal.values()) {
    if (!tasks.has(task.id)) {
      tasks.set(task.id, task);
      insertIntoOrder(task);
      linkDeps(task);
    }
  }
  problems = snap.problems || [];
}

/** Show `task` if it is newer than what the page shows. Returns true when applied. `older`:
 * a finished task loaded from the API, already counted in its stage's count. */
export function applyTask(task, { older = false } = {}) {
  prepare(task);
  const shown = tasks.get(task.id);
  if (shown && task.version <= shown.version) return false;
  const redraw = [task.id];
  if (shown) {
    removeFromOrder(shown);
    if (shown.stage !== task.stage) {
      counts[shown.stage] = Math.max(0, (counts[shown.stage] || 0) - 1);
      counts[task.stage] = (counts[task.stage] || 0) + 1;
      redraw.push(...(dependents.get(task.id) || []));
    }
  } else if (!older) {
    counts[task.stage] = (counts[task.stage] || 0) + 1;
    redraw.push(...(dependents.get(task.id) || []));
  }
  tasks.set(task.id, task);
  insertIntoOrder(task);
  if (!shown) linkDeps(task);
  if (older) olderTerminal.set(task.id, task);
  changed(redraw, true);
  return true;
}

/** A task the prune deleted: its card goes, and it leaves the count of its column (`stage`:
 * the stage it was deleted in, for a task the page never loaded; a loaded one is counted where
 * the page shows it). */
export function removeTask(id, stage) {
  const shown = tasks.get(id);
  const from = shown ? shown.stage : stage;
  counts[from] = Math.max(0, (counts[from] || 0) - 1);
  if (shown) {
    removeFromOrder(shown);
    tasks.delete(id);
    for (const dep of shown.deps || []) dependents.get(dep)?.delete(id);
  }
  olderTerminal.delete(id);
  changed([id], true);
}

/** "show more" of a terminal column: older finished tasks from the API, until at least one is
 * new to the page or none is left. The API lists oldest first; its pages are merged into the
 * column, which stays sorted most recent first (a newest-first listing would fit better). */
export async function loadOlder(stage, pageSize) {
  let added = 0;
  while (added === 0) {
    const cursor = showMoreCursor.get(stage);
    if (cursor === null) break;
    const url = `/api/tasks?stage=${stage}&limit=${pageSize}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const page = await response.json();
    for (const task of page.items) if (applyTask(task, { older: true })) added++;
    showMoreCursor.set(stage, page.next || null);
  }
}

// ------------------------------------------------------------------------------------------
// Dependencies

/** Whether dependency `dep` has completed: true or false, or null while unknown (a task not on
 * the board is then asked of the API, a few at a time, and its dependents redrawn). */
export function depDone(dep) {
  const task = tasks.get(dep) || depInfo.get(dep);
  if (!task) {
    fetchDep(dep);
    return null;
  }
  return task.stage === "COMPLETED";
}

/** The dependencies of `task` not known to be COMPLETED (unknown ones count: the server
 * admits only when every one has completed). */
export function unfinishedDeps(task) {
  return (task.deps || []).filter((d) => depDone(d) !== true);
}

const depQueue = [];
const depAsked = new Set();
let depFetching = 0;

function fetchDep(id) {
  if (depAsked.has(id) || depAsked.size >= 1000) return; // shown as "?" past that
  depAsked.add(id);
  depQueue.push(id);
  pumpDeps();
}

/** GET /api/tasks/{id} with the page's session: the task, or null when there is none (404);
 * any other answer throws. */
export async function fetchTask(id) {
  const response = await fetch(`/api/tasks/${encodeURIComponent(id)}`, { credentials: "same-origin" });
  if (response.status === 404) return null;
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  return response.json();
}

function pumpDeps() {
  while (depFetching < 4 && depQueue.length) {
    const id = depQueue.shift();
    depFetching++;
    fetchTask(id)
      .then((task) => {
        depInfo.set(id, { stage: task ? task.stage : "UNKNOWN" });
        changed([...(dependents.get(id) || [])], false);
      })
      .catch(() => {})
      .finally(() => { depFetching--; pumpDeps(); });
  }
}

const STRANDABLE = new Set(["PENDING", "QUEUED", "RUNNING", "PAUSED"]); // as check()'s dead_dep

/** The tasks that wait for `id`, directly or down the chain, and that a cancel leaves unable
 * to run: {ids (sorted), complete}. Only live tasks are walked (a finished one waits for
 * nothing), and every live task is on the page (the snapshot holds them all); `complete` is
 * false when a live column holds fewer cards than its count says. */
export function strandedBy(id) {
  const found = new Set();
  const todo = [id];
  while (todo.length) {
    for (const next of dependents.get(todo.pop()) || []) {
      const task = tasks.get(next);
      if (found.has(next) || !task || !STRANDABLE.has(task.stage)) continue;
      found.add(next);
      todo.push(next);
    }
  }
  const complete = STAGES.every((s) => TERMINAL.has(s) || order.get(s).length >= (counts[s] || 0));
  return { ids: [...found].sort(), complete };
}
