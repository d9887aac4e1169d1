// The view: the filters (text, owner, queue, one stage) and the open task, kept in the URL
// /board/?q=&owner=&queue=&stage=&task= so that a link opens the same view. Filters replace the
// history entry as they are typed; opening or closing a task adds one, so that back and forward
// walk the tasks looked at. Also the choices the queue and owner filters offer.
//
// It holds what the view is, not how it is drawn: render.js (which cards show, the counts) and
// details.js (the panel of the open task) subscribe to its changes (`subscribeView`). It listens
// to the model (store.js) for the snapshot that a task named by the URL waits for.

import { COLUMN_ELS, columnsEl, showMessage, STAGES } from "./page.js";
import { allTasks, filterMatches, getTask, hasTask, idsIn, snapshotCount, subscribe } from "./store.js";
import { loadMatches, loadMoreMatches, loadTask } from "./api.js";

const listeners = [];

/** `listener(change)` is called, synchronously, with each change of the view:
 *   {what: "filters"}         the filters changed (currentFilter, matches); the server's
 *                             answer to them comes as a store change (matchingCounts)
 *   {what: "open", id}        task `id` was opened (openTaskId)
 *   {what: "close", id}       the open task `id` was closed */
export function subscribeView(listener) {
  listeners.push(listener);
}

function tell(change) {
  for (const listener of listeners) listener(change);
}

const filterText = document.getElementById("filter-text");
const filterOwner = document.getElementById("filter-owner");
const filterQueue = document.getElementById("filter-queue");
const filterStage = document.getElementById("filter-stage");

/** The filters that hide cards ({text, owner, queue, search}, text and owner in lower case), or
 * null when none is set. (The stage filter hides columns, not cards.) A text box holding a
 * qualifier (tag:urgent, payload.repo:acme/web: board/engine/search.py) is a search line, which
 * the server answers: `search` holds it as typed, and `text` is empty. */
export function currentFilter() {
  const raw = filterText.value.trim();
  const owner = filterOwner.value.trim().toLowerCase();
  const queue = filterQueue.value;
  if (QUALIFIER.test(raw)) return { text: "", owner, queue, search: raw };
  const text = raw.toLowerCase();
  return text || owner || queue ? { text, owner, queue, search: "" } : null;
}

const QUALIFIER = /(^|\s)[A-Za-z][A-Za-z0-9_.-]*:/;

/** The one stage the stage filter shows, or "" for all of them. */
export function currentStage() {
  return filterStage.value;
}

/** Whether `task`'s card shows under filter `f`. A search line's matches are the server's (the
 * ids it named, and the finished cards it sent): none shows until it has answered. */
export function matches(task, f) {
  if (f.queue && task.queue !== f.queue) return false;
  if (f.owner && !(task.owner || "").toLowerCase().includes(f.owner)) return false;
  if (f.text && !task.id.toLowerCase().includes(f.text) && !task.title.toLowerCase().includes(f.text)) return false;
  if (f.search) {
    const server = filterMatches();
    return !!(server && server.key === keyOf(f) && server.ids && server.ids.has(task.id));
  }
  return true;
}

/** How many of the cards loaded in `stage`'s column match filter `f`. */
export function matchingLoaded(stage, f = currentFilter()) {
  let n = 0;
  if (f) for (const id of idsIn(stage)) if (matches(getTask(id), f)) n++;
  return n;
}

const keyOf = (f) => JSON.stringify([f.text, f.owner, f.queue, f.search]);

/** The server's answer to the current filter ({counts, more}: store.filterMatches), or null
 * while it has not answered this filter. */
export function currentMatches() {
  const f = currentFilter();
  const matched = filterMatches();
  return f && matched && matched.key === keyOf(f) ? matched : null;
}

/** Per stage, how many tasks match the filter; null when none is set. A column holds a window
 * of its tasks (its first page, and those scrolled to), so the server counts over every task
 * (GET /board/filter, asked again at most REFRESH_MS after a change); the loaded cards are
 * counted here only until it answers. */
export function matchingCounts() {
  const f = currentFilter();
  if (!f) return null;
  const server = currentMatches();
  const out = {};
  for (const stage of STAGES) out[stage] = server ? server.counts[stage] : matchingLoaded(stage, f);
  return out;
}

/** "show more" of column `stage` under the filter: its next page of matches lands. */
export async function loadMoreMatching(stage) {
  const f = currentFilter();
  if (f) await loadMoreMatches(stage, f, keyOf(f));
}

// Asking the server: at once when the filter changes, then at most every REFRESH_MS while tasks
// change (a finished column's count moves with changes the page may not hold).
const REFRESH_MS = 1000;
let refreshTimer = null;

function askServer() {
  clearTimeout(refreshTimer);
  refreshTimer = null;
  const f = currentFilter();
  if (!f) return;
  loadMatches(f, keyOf(f)).catch((err) => showMessage(`could not search every task: ${err.message || err}`, "error"));
}

function askServerSoon() {
  if (refreshTimer === null && currentFilter()) refreshTimer = setTimeout(askServer, REFRESH_MS);
}

function applyFilters() {
  columnsEl.classList.toggle("filtered", !!currentFilter());
  // A stage filter shows that column only.
  for (const [stage, column] of COLUMN_ELS) column.hidden = !!filterStage.value && stage !== filterStage.value;
  tell({ what: "filters" }); // render.js hides the cards that do not match, and counts again
  writeUrl("replace");
  askServer();
}

export function clearFilters() {
  filterText.value = filterOwner.value = filterQueue.value = filterStage.value = "";
  applyFilters();
}

// ------------------------------------------------------------------------------------------
// The queues and owners the filters offer: those seen on the board so far

const knownQueues = new Set();
const knownOwners = new Set();

export function refreshFilterChoices() {
  let changedQueues = false;
  let changedOwners = false;
  for (const task of allTasks()) {
    if (!knownQueues.has(task.queue)) { knownQueues.add(task.queue); changedQueues = true; }
    if (task.owner && !knownOwners.has(task.owner)) { knownOwners.add(task.owner); changedOwners = true; }
    if (knownOwners.size > 500) break;
  }
  if (changedQueues) {
    const selected = filterQueue.value;
    const options = [new Option("all queues", "")];
    for (const q of [...knownQueues].sort()) options.push(new Option(q, q));
    filterQueue.replaceChildren(...options);
    filterQueue.value = selected;
  }
  if (changedOwners) {
    document.getElementById("owners").replaceChildren(...[...knownOwners].sort().map((o) => new Option(o, o)));
  }
}

// ------------------------------------------------------------------------------------------
// The open task

let openId = null; // the task shown in the details panel, or null when it is closed

export function openTaskId() {
  return openId;
}

/** Open task `id` in the details panel (a history entry of its own). */
export function openTask(id) {
  openId = id;
  tell({ what: "open", id });
  writeUrl("push");
}

/** Close the details panel (a history entry of its own). */
export function closeTask() {
  if (openId === null) return;
  const id = openId;
  openId = null;
  tell({ what: "close", id });
  writeUrl("push");
}

// ------------------------------------------------------------------------------------------
// The URL

let restoring = false; // applying the URL: write nothing back
let taskFromUrl = null; // a task the URL names, opened once the first snapshot is here

function urlOfView() {
  const params = new URLSearchParams();
  const put = (name, value) => { if (value.trim()) params.set(name, value); };
  put("q", filterText.value);
  put("owner", filterOwner.value);
  put("queue", filterQueue.value);
  put("stage", filterStage.value);
  const task = openTaskId() || taskFromUrl;
  if (task) params.set("task", task);
  const at = new URLSearchParams(location.search).get("at"); // moment.js's: the moment shown, kept as it is
  if (at) params.set("at", at);
  const query = params.toString();
  return location.pathname + (query ? `?${query}` : "") + location.hash;
}

/** Put the view in the URL: "push" adds a history entry, "replace" rewrites the current one. */
function writeUrl(how) {
  if (restoring) return;
  const url = urlOfView();
  if (url === location.pathname + location.search + location.hash) return;
  if (how === "push") history.pushState(null, "", url);
  else history.replaceState(null, "", url);
}

/** Show the view the URL describes (on load, and on back / forward). */
export function restoreView() {
  const params = new URLSearchParams(location.search);
  restoring = true;
  try {
    filterText.value = params.get("q") || "";
    filterOwner.value = params.get("owner") || "";
    const queue = params.get("queue") || "";
    if (queue && !knownQueues.has(queue)) {
      knownQueues.add(queue);
      filterQueue.append(new Option(queue, queue)); // sorted in when the next queue shows up
    }
    filterQueue.value = queue;
    const stage = params.get("stage") || "";
    filterStage.value = STAGES.includes(stage) ? stage : "";
    applyFilters();
    const task = params.get("task");
    if (!task) {
      taskFromUrl = null;
      if (openTaskId()) closeTask();
    } else if (task !== openTaskId()) {
      taskFromUrl = task;
      if (snapshotCount() > 0) openTaskFromUrl();
    }
  } finally {
    restoring = false;
  }
}

/** Open the task the URL names: from the board, or from the API when it is not loaded
 * (an older finished task); it then stays on the board like a "show more" one. Called again
 * after each snapshot (the first one is what it waits for). */
async function openTaskFromUrl() {
  const id = taskFromUrl;
  if (!id) return;
  if (!hasTask(id)) {
    let loaded = null;
    try {
      loaded = await loadTask(id); // it lands on the board
    } catch (err) {
      showMessage(`could not load task ${id}: ${err.message || err}`, "error");
      return;
    }
    if (taskFromUrl !== id) return; // the URL moved on meanwhile
    if (!loaded) {
      taskFromUrl = null;
      writeUrl("replace");
      showMessage(`task ${id} does not exist`, "error");
      return;
    }
  }
  if (taskFromUrl !== id) return;
  taskFromUrl = null;
  restoring = true;
  try {
    openTask(id);
  } finally {
    restoring = false;
  }
}

/** Filters apply as they are typed (debounced); back and forward restore the view; each
 * snapshot may bring the task the URL names. */
export function startView() {
  subscribe((change) => {
    if (change.what === "snapshot") openTaskFromUrl();
    if (change.what === "snapshot" || (change.what === "tasks" && change.counts && !change.matches)) askServerSoon();
    // A search line's matches came: which cards show changed with them (render.js hides the others).
    if (change.what === "tasks" && change.matches && currentFilter()?.search) tell({ what: "filters" });
  });
  let filterTimer = null;
  for (const input of [filterText, filterOwner, filterQueue, filterStage]) {
    input.addEventListener("input", () => {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(applyFilters, 80);
    });
  }
  // The form only holds the filters: Enter in one of them must not reload the page.
  document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  window.addEventListener("popstate", restoreView);
}
