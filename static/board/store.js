// The page's model of the board: every task it knows (as the server last sent it), the order
// of each column, the count of each stage, who waits for whom, the problems, the agents and
// throughput panel's figures, the queues (limits, running counts, pauses), the approvals waiting
// for an answer (the Needs-you lane). No DOM, no network:
// it is fed, and it tells.
//
// Fed only by socket.js (the snapshot, changed and removed tasks, problems, insights, queues) and api.js
// (the answers that must land: a fetched task, a page of older finished tasks, the stage of a
// dependency not on the board). Its writers are the apply*, set* and remove* functions;
// tests/test_js_modules.py keeps every other module to the readers.
// It tells through `subscribe(listener)`: render.js, details.js, view.js, insights.js and
// api.js listen (see `subscribe` for the changes).
//
// One rule keeps it right whatever order things arrive in: a task replaces the one shown only
// when its version is newer. A task as the server sends it (the API's task; the socket's cards
// leave out description, payload, checkpoint and result) gets its times parsed once, in
// milliseconds since the epoch: createdMs, updatedMs, leaseExpiresMs (null without a lease),
// inStageSinceMs (when it entered its stage).

import { ancestorsOf, rateText, resourceNeeds, STAGES, TERMINAL } from "./page.js";

// A column holds a window of its tasks: the snapshot's first page of each (the server's
// COLUMN_PAGE, in the column's order), grown a page at a time as the user scrolls (applyPage).
// `edges` holds, per column, the last card of its window (its sort key, as that card was when
// loaded), and `moreCursors` the API cursor of the page after it (null: the window is the whole
// column, and has no edge). A change lands on a card when the task is shown already, or when it
// sorts inside its column's window; any other change is kept in `offWindow` (the newest state
// the page knows of a task it does not show): the version rule holds for it, a page landing
// later places it where it belongs, and a dependency's stage is read from it.
const tasks = new Map(); // id -> task shown (in its column's `order`)
const offWindow = new Map(); // id -> the newest task the socket brought that sorts past its column's window
const dependents = new Map(); // dependency id -> Set of ids of the tasks that wait for it
const order = new Map(STAGES.map((s) => [s, []])); // stage -> ids shown, in display order
// stage -> tasks in it on the server (all, not only those loaded): the snapshot's counts plus
// every move after it (applyMove), minus the deleted ones (removeTask).
const counts = Object.fromEntries(STAGES.map((s) => [s, 0]));
const moreCursors = new Map(); // stage -> API cursor of its next page, or null once everything was loaded
const edges = new Map(); // stage -> {stage, claim_rank, id, updatedMs} of the window's last card; none when whole
const olderTerminal = new Map(); // finished tasks loaded outside a window ("show more" under a filter, a link), kept over snapshots
// id -> version of the cards a column let go of (removeColumnTail): a late answer can bring no older state back.
const forgotten = new Map();
// stage -> how many cards the column held after its last load (the snapshot, a page, the filter's
// answer): what the socket added since is its growth (columnGrowth), which removeColumnTail undoes.
const loadedSize = new Map();
const depInfo = new Map(); // id -> {stage} of dependencies not on the board (fetched)
const depAsked = new Set(); // dependencies not on the board already asked for
// check()'s findings as the server last sent them; null while it has run none yet (a snapshot's
// problems: null), which the panel says.
let problems = null;
const bulkJobs = new Map(); // bulk job id -> its latest report (setBulkJob)
let insights = null;
let queues = null; // the latest "queues" frame, or null before the first
// Why a queue takes no claim now, by name, as the latest "queues" frame says: "queue ci paused",
// "queue ci at its limit 2/2" or its rate's next claim time (a queue open for claims is not in
// it); the concurrency keys at their limit ("repo:web at its limit 1/1"); and the rate keys
// whose slow rate holds the next claim back ("provider:llm rate 6/min, next at 14:05:03").
const closedQueues = new Map();
const fullKeys = new Map();
const heldRateKeys = new Map();
const spentFairnessKeys = new Map();
// The resources that hold something back, by name, as the latest "queues" frame says ({name,
// capacity, held, holds_below, holders, more_holders}); and what each QUEUED card waiting for
// one said when that frame came (id -> text), to redraw the cards whose reason changed.
const heldResources = new Map();
const resourceWaits = new Map();
// The approvals waiting for an answer (GET /api/approvals?state=waiting, landed by api.js), oldest
// first; null before the first answer. The Needs-you lane (approvals.js) draws them.
let waitingApprovals = null;
let snapshotsApplied = 0;
// The server's latest answer to the board's filter: {key (the filter it answers), counts (per
// stage), more (finished stage -> cursor of its next matches, or null), ids (a search line's
// matching tasks, a Set; null for plain filters, which the page matches itself)}; null before any.
let matched = null;

const listeners = [];

/** `listener(change)` is called, synchronously and in order, with each change:
 *   {what: "snapshot"}                  everything was replaced (draw it all again)
 *   {what: "tasks", ids, counts}        the cards of `ids` must be redrawn (a task that changed,
 *                                       and the tasks that wait for it); `counts`: whether the
 *                                       columns' counts or "show more" may have changed;
 *                                       `matches`: the server answered the filter (applyMatches)
 *   {what: "problems"}                  check()'s findings changed (getProblems)
 *   {what: "insights"}                  the agents and throughput panel's figures (getInsights)
 *   {what: "queues"}                    the queues strip's content (getQueues); the cards a
 *                                       pause or resume concerns come as a "tasks" change
 *   {what: "closed"}                    the queues that take no claim now changed
 *                                       (closedQueueList): a frame, or a rate's time passed
 *   {what: "missing", id}               a dependency not on the board was asked about: api.js
 *                                       fetches its stage (setDepStage)
 *   {what: "bulk", id}                  a bulk job's progress (getBulkJob): a "bulk" frame, or
 *                                       the API's answer about the job
 *   {what: "approvals"}                 the waiting approvals were read again (getApprovals) */
export function subscribe(listener) {
  listeners.push(listener);
}

function tell(change) {
  for (const listener of listeners) listener(change);
}

function changed(ids, countsChanged) {
  tell({ what: "tasks", ids, counts: countsChanged });
}

// ------------------------------------------------------------------------------------------
// Reading

export function getTask(id) {
  return tasks.get(id);
}

export function hasTask(id) {
  return tasks.has(id);
}

/** Every task on the board, in no particular order. */
export function allTasks() {
  return tasks.values();
}

/** The ids of `stage`'s column in display order (the model's own array: read it, never change it). */
export function idsIn(stage) {
  return order.get(stage);
}

/** How many tasks `stage` holds on the server (not only those loaded). */
export function countIn(stage) {
  return counts[stage] || 0;
}

/** The API cursor of a column's next page (GET /board/filter?stage=&cursor=): null once
 * everything was loaded. */
export function moreCursor(stage) {
  return moreCursors.get(stage);
}

/** How many tasks the page keeps off its windows (socket.js takes a snapshot past OFF_WINDOW_MAX). */
export function offWindowSize() {
  return offWindow.size;
}

/** The newest state the page knows of task `id`, shown or not (undefined: none). */
export function knownTask(id) {
  return tasks.get(id) || offWindow.get(id);
}

export function getProblems() {
  return problems || [];
}

/** Whether the problems are check()'s (false before the server process's first check()). */
export function problemsChecked() {
  return problems !== null;
}

/** What check() says strands `id` (its dead_dep problem: a dependency, or one down the chain,
 * was CANCELLED or FAILED, so it can never run), or undefined. */
export function strandedWhy(id) {
  const problem = getProblems().find((p) => p.task === id && p.code === "dead_dep");
  return problem && problem.text;
}

/** What check() says keeps `id` from every claimer (its unclaimable_requirements problem: no
 * live agent key used in the last hour holds all the capabilities it requires), or undefined. */
export function unclaimableWhy(id) {
  const problem = getProblems().find((p) => p.task === id && p.code === "unclaimable_requirements");
  return problem && problem.text;
}

/** The latest {"type": "insights", ...} frame, or null before the first. */
export function getInsights() {
  return insights;
}

/** The latest {"type": "queues", queues, more_queues} frame, or null before the first. */
export function getQueues() {
  return queues;
}

/** Why queue `name` takes no claim now ("queue ci paused", "queue ci at its limit 2/2", "rate
 * 6/min, next at 14:05:03"), or undefined when it does, as the latest "queues" frame says. */
export function queueClosed(name) {
  return closedQueues.get(name);
}

/** Every queue that takes no claim now, as [name, why] pairs (queueClosed's reasons). */
export function closedQueueList() {
  return [...closedQueues];
}

/** "repo:web at its limit 1/1" when concurrency key `name` is full, as the latest "queues"
 * frame says; else undefined. */
export function keyFull(name) {
  return fullKeys.get(name);
}

/** "provider:llm rate 6/min, next at 14:05:03" while rate key `name` holds the next claim of its
 * tasks back, as the latest "queues" frame says; else undefined. */
export function rateKeyHeld(name) {
  return heldRateKeys.get(name);
}

/** "fairness key team-a's budget is spent" while fairness key `name`'s budget holds its tasks
 * back, as the latest "queues" frame says; else undefined. */
export function fairnessKeySpent(name) {
  return spentFairnessKeys.get(name);
}

/** What keeps QUEUED `task` from being claimed among its resources, as the latest "queues"
 * frame says, or undefined when none does: {text: "merge-slot held by worker-3", why: "resource
 * merge-slot held by worker-3 (task t1)", holders: [{task, agent, node}]}. A port of the
 * engine's why_waiting (board/engine/resources.py), in its words: the task's nodes in order (each
 * resource's node, and an intent on each node above it), the first that is not free, and the
 * holds that keep it so: of the node and the nodes above it, and for a hold of a directory's node
 * the holds inside it. A resource the frame does not list holds nothing back (or is past its bound). */
export function resourceWait(task) {
  if (task.stage !== "QUEUED" || !task.resources || !heldResources.size) return undefined;
  const needs = new Map(); // node -> units: null exclusive, 0 an intent, else shared units
  for (const need of resourceNeeds(task.resources)) {
    needs.set(need.node, need.units);
    for (const above of ancestorsOf(need.node)) if (!needs.has(above)) needs.set(above, 0);
  }
  for (const node of [...needs.keys()].sort()) {
    const units = needs.get(node);
    const row = heldResources.get(node);
    if (!row) continue;
    const free = units === 0 ? row.held === 0
      : units === null ? row.held === 0 && row.holds_below === 0
        : row.holds_below === 0 && row.held !== "exclusive" && row.held + units <= row.capacity;
    if (free) continue;
    const above = new Set([node, ...ancestorsOf(node)]);
    const inside = units !== 0 && (node.endsWith("/") || node.endsWith(":"));
    const blocking = [...heldResources.values()]
      .filter((r) => r.held !== 0 && (above.has(r.name) || (inside && r.name.startsWith(node))))
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    const holders = blocking.flatMap((r) => r.holders.map((h) => ({ ...h, node: r.name })))
      .filter((h) => h.task !== task.id);
    if (!holders.length) return { text: `${node} held`, why: `resource ${node} is held`, holders: [] };
    const first = holders[0];
    const what = first.node === node ? node : `${node} (by ${first.node})`;
    const others = holders.length - 1 + blocking.reduce((n, r) => n + r.more_holders, 0);
    const tail = others ? ` and ${others} more` : "";
    return {
      text: `${what} held by ${first.agent}${tail}`,
      why: `resource ${what} held by ${first.agent} (task ${first.task})${tail}`,
      holders,
    };
  }
  return undefined;
}

/** The server's latest answer to the board's filter (applyMatches), or null. */
export function filterMatches() {
  return matched;
}

/** How many snapshots the page has applied since it was loaded (0: it shows nothing yet). */
export function snapshotCount() {
  return snapshotsApplied;
}

// ------------------------------------------------------------------------------------------
// Fed by socket.js and api.js

/** A bulk job as its latest "bulk" frame or API answer says ({id, state, total, done, skipped,
 * lost, skipped_reasons, problems, ...}); a report that counts fewer moves than the one held
 * (an older frame arriving late) does not replace it. */
export function setBulkJob(job) {
  const held = bulkJobs.get(job.id);
  const reached = (j) => j.done + j.skipped + j.lost;
  const finished = (j) => ["stopped", "done", "failed"].includes(j.state);
  if (held && (reached(job) < reached(held) || (finished(held) && !finished(job)))) return;
  bulkJobs.set(job.id, { ...held, ...job });
  tell({ what: "bulk", id: job.id });
}

export function getBulkJob(id) {
  return bulkJobs.get(id) || null;
}

/** The approvals waiting for an answer, oldest first, as the API last said (empty before). */
export function getApprovals() {
  return waitingApprovals || [];
}

/** Task `id`'s approval waiting for an answer, as the API last listed them, or undefined. */
export function waitingApprovalOf(id) {
  return waitingApprovals ? waitingApprovals.find((a) => a.task === id) : undefined;
}

/** The waiting approvals as GET /api/approvals?state=waiting listed them (api.js). */
export function setApprovals(list) {
  waitingApprovals = list;
  tell({ what: "approvals" });
}

export function setProblems(list) {
  problems = list;
  tell({ what: "problems" });
}

export function setInsights(frame) {
  insights = frame;
  tell({ what: "insights" });
}

/** A "queues" frame: the strip redraws, and so do the QUEUED cards of every queue or
 * concurrency key that closed or opened or whose reason changed (they say "waiting: queue NAME
 * paused", "... at its limit 2/2", "waiting: KEY at its limit 1/1", "waiting: rate 6/min, next
 * at 14:05:03"). A rate's next claim time passes with no frame: a timer reopens its queue then. */
export function setQueues(frame) {
  queues = frame;
  tell({ what: "queues" });
  closeAndOpen();
}

let reopenTimer = null;

function closeAndOpen() {
  const now = Date.now();
  let reopensAt = Infinity;
  const closed = new Map();
  for (const q of queues.queues) {
    const nextMs = q.next_claim_at ? Date.parse(q.next_claim_at) : NaN;
    if (q.paused) closed.set(q.name, `queue ${q.name} paused`);
    else if (q.budget_exhausted) closed.set(q.name, `queue ${q.name}'s budget is spent`);
    else if (q.concurrency !== null && q.running >= q.concurrency) {
      closed.set(q.name, `queue ${q.name} at its limit ${q.running}/${q.concurrency}`);
    } else if (q.rate && nextMs > now) {
      closed.set(q.name, `${rateText(q.rate)}, next at ${new Date(nextMs).toLocaleTimeString()}`);
      reopensAt = Math.min(reopensAt, nextMs);
    }
  }
  const full = new Map();
  for (const k of queues.keys || []) {
    if (k.running >= k.concurrency) full.set(k.name, `${k.name} at its limit ${k.running}/${k.concurrency}`);
  }
  const held = new Map();
  for (const k of queues.rate_keys || []) {
    const nextMs = k.next_claim_at ? Date.parse(k.next_claim_at) : NaN;
    if (k.rate && nextMs > now) {
      held.set(k.name, `${k.name} ${rateText(k.rate)}, next at ${new Date(nextMs).toLocaleTimeString()}`);
      reopensAt = Math.min(reopensAt, nextMs);
    }
  }
  const spent = new Map();
  for (const k of queues.fairness_keys || []) {
    if (k.budget_exhausted) spent.set(k.name, `fairness key ${k.name}'s budget is spent`);
  }
  const flippedQueues = flips(closedQueues, closed);
  const flippedKeys = flips(fullKeys, full);
  const flippedRateKeys = flips(heldRateKeys, held);
  const flippedFairnessKeys = flips(spentFairnessKeys, spent);
  const flippedWaits = reviewResourceWaits();
  clearTimeout(reopenTimer);
  if (reopensAt < Infinity) reopenTimer = setTimeout(closeAndOpen, reopensAt - now + 50);
  if (flippedQueues.size) tell({ what: "closed" });
  if (flippedQueues.size || flippedKeys.size || flippedRateKeys.size || flippedFairnessKeys.size
      || flippedWaits.size) {
    changed(order.get("QUEUED").filter((id) => {
      const task = tasks.get(id);
      return flippedQueues.has(task.queue) || (task.concurrency_key && flippedKeys.has(task.concurrency_key))
        || (task.rate_key && flippedRateKeys.has(task.rate_key))
        || (task.fairness_key && flippedFairnessKeys.has(task.fairness_key)) || flippedWaits.has(id);
    }), false);
  }
}

/** The frame's resources replace the last ones; the QUEUED tasks with resources whose wait
 * (resourceWait) came, went or changed. */
function reviewResourceWaits() {
  heldResources.clear();
  for (const r of queues.resources || []) heldResources.set(r.name, r);
  const now = new Map();
  for (const id of order.get("QUEUED")) {
    const task = tasks.get(id);
    const wait = task.resources ? resourceWait(task) : undefined;
    if (wait) now.set(id, wait.why);
  }
  return flips(resourceWaits, now);
}

/** Replace `shown` (name -> why) by `now`; the names whose reason came, went or changed. */
function flips(shown, now) {
  const flipped = new Set();
  for (const [name, why] of now) if (shown.get(name) !== why) flipped.add(name);
  for (const name of shown.keys()) if (!now.has(name)) flipped.add(name);
  shown.clear();
  for (const [name, why] of now) shown.set(name, why);
  return flipped;
}

/** A column's next page (GET /board/filter?stage=, api.js): its tasks land on cards (newer
 * ones only, like any), the window now ends at its last card, and the changes the socket
 * brought of tasks that now fall inside it are shown too. `cursor`: the page after it, or null
 * when this was the column's last. Returns how many cards it added. */
export function applyPage(stage, page, cursor) {
  const redraw = [];
  let added = 0;
  for (const task of page) {
    const landed = land(task, "always");
    if (landed) { redraw.push(...landed); added++; }
  }
  moreCursors.set(stage, cursor);
  // The window ends at the page's last card as the server read it (prepared by land).
  if (cursor === null) edges.delete(stage);
  else if (page.length) edges.set(stage, edgeOf(page[page.length - 1]));
  for (const task of [...offWindow.values()]) {
    if (task.stage === stage && inWindow(task)) redraw.push(...(land(task, "page") || []));
  }
  loadedSize.set(stage, order.get(stage).length);
  changed(redraw, true);
  return added;
}

/** The stage of dependency `id`, not on the board ("UNKNOWN" when the API has no such task). */
export function setDepStage(id, stage) {
  depInfo.set(id, { stage });
  changed([...(dependents.get(id) || [])], false);
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

// Display order: live stages as the server lists them, the order claims take them in (the line's
// claim_rank, then id: board/engine/fairness.py); terminal stages most recent first. (The server
// pages a column in the same order: board/live/reads.py column_order.)
function compare(a, b) {
  if (TERMINAL.has(a.stage)) {
    if (a.updatedMs !== b.updatedMs) return b.updatedMs - a.updatedMs;
    return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
  }
  if (a.claim_rank !== b.claim_rank) return a.claim_rank - b.claim_rank;
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

const edgeOf = (task) => ({ stage: task.stage, claim_rank: task.claim_rank, id: task.id, updatedMs: task.updatedMs });

/** Whether `task` sorts inside its column's window (at or before the window's last card). */
function inWindow(task) {
  const edge = edges.get(task.stage);
  return !edge || compare(task, edge) <= 0;
}

/** Replace everything with the snapshot's board: each column's first page, its count and the
 * cursor of its next page (the finished tasks loaded outside a window stay). */
export function applySnapshot(snap) {
  snapshotsApplied++;
  tasks.clear();
  offWindow.clear();
  forgotten.clear();
  dependents.clear();
  edges.clear();
  for (const s of STAGES) {
    order.set(s, []);
    counts[s] = snap.counts[s] || 0;
    moreCursors.set(s, (snap.next_pages || {})[s] || null);
  }
  for (const task of snap.tasks) {
    prepare(task);
    tasks.set(task.id, task);
    order.get(task.stage)?.push(task.id);
    linkDeps(task);
  }
  // The server sends them in this order; sorting here too keeps the binary searches exact
  // (times are compared in milliseconds here).
  for (const [stage, ids] of order) {
    ids.sort((a, b) => compare(tasks.get(a), tasks.get(b)));
    loadedSize.set(stage, ids.length);
    if (moreCursors.get(stage) !== null && ids.length) edges.set(stage, edgeOf(tasks.get(ids[ids.length - 1])));
  }
  for (const task of olderTerminal.values()) {
    if (!tasks.has(task.id) && TERMINAL.has(task.stage)) {
      tasks.set(task.id, task);
      insertIntoOrder(task);
      linkDeps(task);
    }
  }
  problems = snap.problems ?? null;
  tell({ what: "snapshot" });
}

/** Show `task` if it is newer than what the page knows. Returns true when applied. `older`: a
 * task loaded from the API (a link, the details panel): shown wherever it sorts, window or not.
 * Counts do not change here: they follow the socket's events (applyMove). */
export function applyTask(task, { older = false } = {}) {
  const redraw = land(task, older ? "always" : "window");
  if (redraw) changed(redraw, true);
  return !!redraw;
}

/** applyTask without telling: the ids to redraw, or null when `task` was not newer. `place`:
 * "window" (a socket change: shown when its task is, or when it sorts inside its column's
 * window; else kept off the window), "always" (loaded from the API: shown, and kept over
 * snapshots when finished) or "page" (a change kept off the window that a page now covers). A
 * task kept off the window is shown by "always" or "page" at the same version too. */
function land(task, place) {
  prepare(task);
  const shown = tasks.get(task.id);
  const known = shown || offWindow.get(task.id);
  const knownVersion = known ? known.version : forgotten.get(task.id);
  if (knownVersion !== undefined
      && (task.version < knownVersion || (task.version === knownVersion && (shown || place === "window")))) {
    return null;
  }
  forgotten.delete(task.id);
  const redraw = [task.id];
  if (!known || known.stage !== task.stage) redraw.push(...(dependents.get(task.id) || []));
  if (shown) removeFromOrder(shown);
  if (shown || place !== "window" || inWindow(task)) {
    offWindow.delete(task.id);
    tasks.set(task.id, task);
    insertIntoOrder(task);
    if (!shown) linkDeps(task);
    if (place === "always") olderTerminal.set(task.id, task);
  } else {
    offWindow.set(task.id, task);
  }
  return redraw;
}

/** How many cards the socket added to `stage`'s column since its last load. */
export function columnGrowth(stage) {
  return order.get(stage).length - (loadedSize.get(stage) || 0);
}

/** Let go of the cards the socket added to `stage`'s column since its last load (a column a busy
 * board kept adding to while its top was watched), from its end: it holds as many cards as
 * then, the newest first. Its window ends at the last one kept, and its next page starts after
 * it (the card's page_cursor, the server's), and `atLeast` cards stay. The versions of those let
 * go are remembered (an older state coming late is not shown). Only without a filter (its
 * matches are not a window). */
export function removeColumnTail(stage, atLeast) {
  const ids = order.get(stage);
  const keep = Math.max(loadedSize.get(stage) || 0, atLeast, 1);
  if (ids.length <= keep) return;
  const last = tasks.get(ids[keep - 1]);
  if (!last.page_cursor) return;
  const gone = ids.splice(keep);
  for (const id of gone) {
    const task = tasks.get(id);
    tasks.delete(id);
    olderTerminal.delete(id);
    forgotten.set(id, task.version);
    for (const dep of task.deps || []) dependents.get(dep)?.delete(id);
  }
  edges.set(stage, edgeOf(last));
  moreCursors.set(stage, last.page_cursor);
  loadedSize.set(stage, keep);
  changed(gone, true);
}

/** A move the socket's events tell (from_stage -> to_stage, once per event after the snapshot,
 * socket.js): the columns' counts follow it, whether or not the page shows the task. */
export function applyMove(event) {
  if (event.from_stage === event.to_stage) return;
  if (event.from_stage) counts[event.from_stage] = Math.max(0, (counts[event.from_stage] || 0) - 1);
  counts[event.to_stage] = (counts[event.to_stage] || 0) + 1;
  changed([], true);
}

/** The server's answer to the board's filter `key` (GET /board/filter, api.js): how many tasks
 * match per stage, its matching finished cards (landed like "show more" ones) and each finished
 * column's cursor to more matches. `page`: the next page of one column (no counts). One "tasks"
 * change tells it, marked `matches` (view.js asks again after other changes, not after these). */
export function applyMatches(key, answer, { page = false } = {}) {
  const redraw = [];
  for (const task of answer.tasks) redraw.push(...(land(task, "always") || []));
  if (!page) {
    // A search line's answer names its matching tasks: the unfinished ones by id, the finished
    // ones by the cards it sent.
    const ids = answer.ids ? new Set(Object.values(answer.ids).flat()) : null;
    matched = { key, counts: answer.counts, more: new Map(), ids };
  }
  for (const task of answer.tasks) loadedSize.set(task.stage, order.get(task.stage).length);
  if (matched && matched.key === key) {
    for (const [stage, cursor] of Object.entries(answer.more)) matched.more.set(stage, cursor);
    if (matched.ids) for (const task of answer.tasks) matched.ids.add(task.id);
  }
  tell({ what: "tasks", ids: redraw, counts: true, matches: true });
}

/** A task the prune deleted: its card goes, and it leaves the count of `stage` (the stage it
 * was deleted in: the counts follow the events, not the cards). */
export function removeTask(id, stage) {
  const shown = tasks.get(id);
  counts[stage] = Math.max(0, (counts[stage] || 0) - 1);
  if (shown) {
    removeFromOrder(shown);
    tasks.delete(id);
    for (const dep of shown.deps || []) dependents.get(dep)?.delete(id);
  }
  offWindow.delete(id);
  olderTerminal.delete(id);
  changed([id], true);
}

// ------------------------------------------------------------------------------------------
// Dependencies

/** Whether dependency `dep` has completed: true or false, or null while unknown (a task not on
 * the board is then asked for: api.js fetches it, a few at a time, and its dependents redraw). */
export function depDone(dep) {
  const task = knownTask(dep) || depInfo.get(dep);
  if (!task) {
    askForDep(dep);
    return null;
  }
  return task.stage === "COMPLETED";
}

/** Whether dependency `dep` is a dead end as far as the board knows (CANCELLED or FAILED). */
export function depDead(dep) {
  const task = knownTask(dep) || depInfo.get(dep);
  return Boolean(task) && (task.stage === "CANCELLED" || task.stage === "FAILED");
}

/** The dependencies of `task` not known to be COMPLETED (unknown ones count: the server
 * admits only when every one has completed). */
export function unfinishedDeps(task) {
  return (task.deps || []).filter((d) => depDone(d) !== true);
}

function askForDep(id) {
  if (depAsked.has(id) || depAsked.size >= 1000) return; // shown as "?" past that
  depAsked.add(id);
  tell({ what: "missing", id });
}

const STRANDABLE = new Set(["PENDING", "QUEUED", "RUNNING", "PAUSED"]); // as check()'s dead_dep

/** The tasks that wait for `id`, directly or down the chain, and that a cancel leaves unable
 * to run: {ids (sorted), complete}. Only live tasks are walked (a finished one waits for
 * nothing), among those the page shows; `complete` is false when a live column holds fewer
 * cards than its count says (its window is not the whole column). */
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
