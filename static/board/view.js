// The view: the filters (text, owner, queue, one stage) and the open task, kept in the URL
// /board/?q=&owner=&queue=&stage=&task= so that a link opens the same view. Filters replace the
// history entry as they are typed; opening or closing a task adds one, so that back and forward
// walk the tasks looked at. Also the choices the queue and owner filters offer.
//
// It holds what the view is, not how it is drawn: render.js (which cards show, the counts) and
// details.js (the panel of the open task) subscribe to its changes (`subscribeView`). It listens
// to the model (store.js) for the snapshot that a task named by the URL waits for.

import { COLUMN_ELS, columnsEl, showMessage, STAGES } from "./page.js";
import { allTasks, getTask, hasTask, idsIn, snapshotCount, subscribe } from "./store.js";
import { loadTask } from "./api.js";

const listeners = [];

/** `listener(change)` is called, synchronously, with each change of the view:
 *   {what: "filters"}         the filters changed (currentFilter, matches)
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

/** The filters that hide cards ({text, owner, queue}, lower case), or null when none is set.
 * (The stage filter hides columns, not cards.) */
export function currentFilter() {
  const text = filterText.value.trim().toLowerCase();
  const owner = filterOwner.value.trim().toLowerCase();
  const queue = filterQueue.value;
  return text || owner || queue ? { text, owner, queue } : null;
}

export function matches(task, f) {
  if (f.queue && task.queue !== f.queue) return false;
  if (f.owner && !(task.owner || "").toLowerCase().includes(f.owner)) return false;
  if (f.text && !task.id.toLowerCase().includes(f.text) && !task.title.toLowerCase().includes(f.text)) return false;
  return true;
}

/** Per stage, how many of the tasks on the board match the filter; null when none is set.
 * (Finished columns hold only their most recent tasks: "3 of 120" counts among those.) */
export function matchingCounts() {
  const f = currentFilter();
  if (!f) return null;
  const out = {};
  for (const stage of STAGES) {
    let n = 0;
    for (const id of idsIn(stage)) if (matches(getTask(id), f)) n++;
    out[stage] = n;
  }
  return out;
}

function applyFilters() {
  columnsEl.classList.toggle("filtered", !!currentFilter());
  // A stage filter shows that column only.
  for (const [stage, column] of COLUMN_ELS) column.hidden = !!filterStage.value && stage !== filterStage.value;
  tell({ what: "filters" }); // render.js hides the cards that do not match, and counts again
  writeUrl("replace");
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
