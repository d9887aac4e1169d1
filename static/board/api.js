// Every request the board's page makes to the HTTP API (/api/tasks..., /api/queues/...,
// /api/approvals, with the page's session cookie) and to the board's filter (/board/filter); the
// websocket is socket.js's. What must land in the model lands here, in store.js: a fetched task
// (applied only when newer, like any), a page of older finished tasks ("show more"), the server's
// answer to the filter, the stage of a dependency not on the board, the task a refused action
// names, the approvals waiting for an answer. An accepted action's result is not applied here: it
// comes back over the socket like any other change.

import {
  applyMatches, applyPage, applyTask, filterMatches, hasTask, moreCursor, prepare, removeColumnTail, setApprovals,
  setBulkJob, setDepStage, subscribe,
} from "./store.js";

const DEP_REQUESTS = 4; // dependencies not on the board asked for at once

async function getJson(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) {
    // The server's own words when it gave them (a refused search line says what is wrong).
    const body = await response.json().catch(() => null);
    throw new Error(body?.error?.message || `HTTP ${response.status}`);
  }
  return response.json();
}

/** GET /api/tasks/{id}: the task, or null when there is none (404); any other answer throws. */
async function fetchTask(id) {
  const response = await fetch(`/api/tasks/${encodeURIComponent(id)}`, { credentials: "same-origin" });
  if (response.status === 404) return null;
  if (!response.ok) throw new Error(`HTTP ${response.status}`);
  return response.json();
}

/** The full task `id` (the socket's cards leave out the bulky fields), landed in the model: a
 * task the board does not show (an older finished one) stays on it like a "show more" one.
 * Resolves to {task, applied} (applied: the board showed an older version), or null when
 * there is no such task; throws when the API fails. */
export async function loadTask(id) {
  const found = await fetchTask(id);
  if (!found) return null;
  const task = prepare(found);
  return { task, applied: applyTask(task, { older: !hasTask(id) }) };
}

/** A column's next page, as the user scrolls to its end (GET /board/filter with no filter: in
 * the column's order, each COMPLETED card with who ran it), until at least one card is new to
 * the page or none is left. Only one load per column runs at a time. */
const loading = new Map(); // stage -> the load under way
export function loadMore(stage) {
  if (!loading.has(stage)) loading.set(stage, loadPages(stage).finally(() => loading.delete(stage)));
  return loading.get(stage);
}

/** Let go of what the socket added to column `stage` since its last load (render.js: a column
 * grown long while its top is watched); scrolling down loads it again. Not while a page of it
 * is loading. */
export function unloadColumnTail(stage, atLeast) {
  if (!loading.has(stage)) removeColumnTail(stage, atLeast);
}

async function loadPages(stage) {
  let added = 0;
  while (added === 0) {
    const cursor = moreCursor(stage);
    if (!cursor) break;
    const page = await getJson(`/board/filter?stage=${stage}&cursor=${encodeURIComponent(cursor)}`);
    if (moreCursor(stage) !== cursor) break; // a snapshot came meanwhile: its windows hold
    added += applyPage(stage, page.tasks, page.more[stage] || null);
  }
}

// The board's filter, answered by the server over every task (board/live/board_filter.py): only
// the latest request's answer lands (one typed letter after another sends several).
let matchRequest = 0;

function filterQuery(filter) {
  const query = new URLSearchParams();
  if (filter.text) query.set("text", filter.text);
  if (filter.owner) query.set("owner", filter.owner);
  if (filter.queue) query.set("queue", filter.queue);
  if (filter.search) query.set("search", filter.search);
  return query;
}

/** Ask the server what `filter` ({text, owner, queue, search}) matches; its counts and the matching
 * finished cards land (store.applyMatches) under `key`, unless a newer request was sent. */
export async function loadMatches(filter, key) {
  const mine = ++matchRequest;
  const answer = await getJson(`/board/filter?${filterQuery(filter)}`);
  if (mine === matchRequest) applyMatches(key, answer);
}

/** "show more" of a column under the filter: its next page of matches. */
export async function loadMoreMatches(stage, filter, key) {
  const matched = filterMatches();
  const cursor = matched && matched.key === key ? matched.more.get(stage) : null;
  if (!cursor) return;
  const query = filterQuery(filter);
  query.set("stage", stage);
  query.set("cursor", cursor);
  applyMatches(key, await getJson(`/board/filter?${query}`), { page: true });
}

/** The task's most recent history row, or null (none, or the request failed). */
export async function lastEvent(id) {
  const response = await fetch(`/api/tasks/${encodeURIComponent(id)}/events?last=1`, { credentials: "same-origin" });
  return response.ok ? (await response.json()).items.pop() || null : null;
}

/** The history of task `id`, oldest first (GET /api/tasks/{id}/events, every page up to 20 of
 * 500); throws when the API fails. Not part of the model: the details panel shows it. */
export async function loadHistory(id) {
  const items = [];
  let cursor = null;
  for (let page = 0; page < 20; page++) {
    const url = `/api/tasks/${encodeURIComponent(id)}/events?limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const response = await fetch(url, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`history: HTTP ${response.status}`);
    const body = await response.json();
    items.push(...body.items);
    cursor = body.next;
    if (!cursor) break;
  }
  return items;
}

/** A plan's graph (/board/graph/data?root= or ?tag=: `query`, as the page was asked): its tasks
 * and dependencies (board/live/graph.py). Throws with the server's words when refused. */
export async function loadPlan(query) {
  return getJson(`/board/graph/data?${query}`);
}

/** The ids of the tasks run again from task `id` (GET /api/tasks?search=replay_of:ID), oldest
 * first, at most 20. */
export async function loadReplays(id) {
  const search = encodeURIComponent(`replay_of:"${id}"`);
  const response = await fetch(`/api/tasks?search=${search}&limit=20`, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`replays: HTTP ${response.status}`);
  return (await response.json()).items.map((t) => t.id);
}

/** GET /api/tasks/{id}/usage: what the task's attempts reported they used ({total, attempts}). */
export async function loadUsage(id) {
  return getJson(`/api/tasks/${encodeURIComponent(id)}/usage`);
}

/** GET /api/tasks/{id}/notes: every note of the task, oldest first (at most 100). */
export async function loadNotes(id) {
  const response = await fetch(`/api/tasks/${encodeURIComponent(id)}/notes`, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`notes: HTTP ${response.status}`);
  return (await response.json()).items;
}

/** POST /api/tasks/{id}/notes as staff (no token: the server wants board.intervene). Resolves as
 * sendJson. */
export async function addNote(id, text) {
  return sendJson("POST", `/api/tasks/${encodeURIComponent(id)}/notes`, { text });
}

const APPROVAL_PAGES = 10; // of 100: the Needs-you lane lists at most 1,000 waiting approvals

/** GET /api/approvals?state=waiting, every page (up to APPROVAL_PAGES of 100), landed in the
 * model (store.setApprovals); throws with the server's words when refused. The lane's only read. */
export async function loadApprovals() {
  const items = [];
  let after = null;
  for (let page = 0; page < APPROVAL_PAGES; page++) {
    const body = await getJson(`/api/approvals?state=waiting&limit=100${after === null ? "" : `&after=${after}`}`);
    items.push(...body.items);
    after = body.next_after;
    if (after === null || after === undefined) break;
  }
  setApprovals(items);
}

/** What loadApprovals would land when a snapshot shows no task awaiting an answer (it holds
 * every unfinished task): none, without a request. */
export function noApprovalsWaiting() {
  setApprovals([]);
}

/** GET /api/tasks/{id}/approvals: every approval task `id` asked for, oldest first (the task
 * page's section; not part of the model). */
export async function loadTaskApprovals(id) {
  return (await getJson(`/api/tasks/${encodeURIComponent(id)}/approvals`)).items;
}

/** POST /api/tasks/{id}/answer {approve, values?, comment?, approval_id} as this staff user (the
 * server judges whether they may answer: 403 forbidden; 409 already_answered when someone answered
 * first; 422 validation_error when the values do not fit the form). Resolves as sendAction: the
 * task moves over the socket, and the lane reads the approvals again when its card says so. */
export async function sendAnswer(id, fields) {
  return sendAction(id, "answer", fields);
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/** Send `fields` as JSON with the CSRF token. Resolves to {ok, status, body}: status null and
 * body.error.message when the request did not get through. */
async function sendJson(method, url, fields) {
  let response = null;
  let body = null;
  try {
    response = await fetch(url, {
      method,
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(fields),
    });
    body = await response.json().catch(() => null);
  } catch (err) {
    body = { error: { message: `network error: ${err.message || err}` } };
  }
  return { ok: !!(response && response.ok), status: response ? response.status : null, body };
}

/** POST /api/tasks/{id}/{path} with `fields` (the version the card shows, and the verb's own).
 * Resolves as sendJson. A refusal's task (error.task: the task as the server has it, e.g. after
 * a lost race) lands: the socket may not have brought it yet, and the card goes back to where the
 * server says it is. An accepted move does not: the socket brings the change. */
export async function sendAction(id, path, fields) {
  const sent = await sendJson("POST", `/api/tasks/${encodeURIComponent(id)}/${path}`, fields);
  const refused = sent.body && sent.body.error && sent.body.error.task;
  if (refused && !sent.ok) applyTask(refused);
  return sent;
}

/** PUT /api/queues/{name} with `fields` ({paused, reason}: pause or resume it); the server wants
 * board.change_queue. Resolves as sendJson. The answer does not land: the queue's new state
 * comes back over the socket ("queues"), as every other page sees it. */
export async function changeQueue(name, fields) {
  return sendJson("PUT", `/api/queues/${encodeURIComponent(name)}`, fields);
}

/** PUT /api/fairness-keys/{name} ({budget, reason}): a fairness key's budget. Resolves as sendJson. */
export async function changeFairnessKey(name, fields) {
  return sendJson("PUT", `/api/fairness-keys/${encodeURIComponent(name)}`, fields);
}

/** POST /api/bulk (board/api/routers/bulk.py): with `dry_run` the count ({total, matching,
 * description}), else the job started (202), which lands in the model; its progress comes over
 * the socket ("bulk" frames). Resolves as sendJson. */
export async function sendBulk(fields) {
  const sent = await sendJson("POST", "/api/bulk", fields);
  if (sent.ok && !fields.dry_run) setBulkJob(sent.body);
  return sent;
}

/** POST /api/bulk/{id}/stop; the job's answer lands (then its frames). Resolves as sendJson. */
export async function stopBulk(id) {
  const sent = await sendJson("POST", `/api/bulk/${id}/stop`, {});
  if (sent.ok) setBulkJob(sent.body);
  return sent;
}

/** GET /api/bulk/{id}: the job as its row says, landed in the model (a frame may have been
 * missed while the socket reconnected). */
export async function loadBulkJob(id) {
  setBulkJob(await getJson(`/api/bulk/${id}`));
}

// Dependencies not on the board: the model asks (a "missing" change), a few are fetched at a
// time, and their stage lands (a failed request leaves the dependency unknown, shown as "?").
const depQueue = [];
let depFetching = 0;

function pumpDeps() {
  while (depFetching < DEP_REQUESTS && depQueue.length) {
    const id = depQueue.shift();
    depFetching++;
    fetchTask(id)
      .then((task) => setDepStage(id, task ? task.stage : "UNKNOWN"))
      .catch(() => {})
      .finally(() => { depFetching--; pumpDeps(); });
  }
}

/** Answer the model's questions about dependencies not on the board. */
export function startApi() {
  subscribe((change) => {
    if (change.what !== "missing") return;
    depQueue.push(change.id);
    pumpDeps();
  });
}

/** GET /api/board?at=: the board as it was at `at` (an ISO time), one page of it (`cursor`), rebuilt from
 * the history by the server (docs/board-at.md). Not landed in the model: the live board stays as it is,
 * and moment.js draws the answer on its own. Throws with the server's words on a refusal. */
export async function loadBoardAt(at, cursor = null) {
  const params = new URLSearchParams({ at });
  if (cursor) params.set("cursor", cursor);
  return getJson(`/api/board?${params}`);
}
