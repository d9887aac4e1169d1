// The details panel of one task: every field (the full task from GET /api/tasks/<id>, since
// the socket's cards leave out the bulky ones), the operator's buttons for its stage, the
// attempt timeline (attempts.js) and the history (GET /api/tasks/<id>/events, every page; its
// rows drawn by timeline.js, as on the task's own page, which the panel links to).
// Opened by a click or Enter on a card, or by the URL; Escape or × closes it. Which task is open
// is the view's (view.js, kept in the URL); this panel follows the view and the model (store.js),
// redrawn once a frame when the open task changes, and after an action on it (actions.js).

import { adminUrl, el, frameBatcher, taskPageUrl } from "./page.js";
import { depDone, getTask, resourceWait, subscribe, unclaimableWhy, unfinishedDeps } from "./store.js";
import { loadHistory, loadNotes, loadTask, loadUsage } from "./api.js";
import { closeTask, openTask, openTaskId, subscribeView } from "./view.js";
import { cardOf } from "./render.js";
import { act, actionsFor, onActed } from "./actions.js";
import { renderAttempts } from "./attempts.js";
import { historyItems } from "./timeline.js";
import { taskFields } from "./taskfields.js";

const details = document.getElementById("details");
let historyFor = null; // "id@version" the history shown was fetched for
let detailsFull = null; // the full task from the API, for the details
const scheduleRedraw = frameBatcher(() => renderDetails(true));

function showPanel(id) {
  historyFor = null;
  detailsFull = null;
  details.hidden = false;
  details.querySelector(".details-admin").href = adminUrl(id);
  pageLink().href = taskPageUrl(id);
  graphLink().href = `/board/graph/?root=${encodeURIComponent(id)}`;
  renderDetails(true);
  // Keyboard users land in the panel (its heading; Tab goes on to the actions), and go back
  // to the card they came from when it closes.
  details.querySelector(".details-title").focus();
}

/** The link to the task's own page (/board/task/<id>), beside the admin's: made here once,
 * so that the board's template stays as it is. */
function pageLink() {
  let link = details.querySelector(".details-page");
  if (!link) {
    link = el("a", "details-page page-link", "full page");
    details.querySelector(".details-admin").before(link);
  }
  return link;
}

/** The link to the plan's graph (/board/graph/?root=<id>), beside the page's: a task without
 * dependencies either way is a plan of one (the graph says so). */
function graphLink() {
  let link = details.querySelector(".details-graph");
  if (!link) {
    link = el("a", "details-graph page-link", "plan graph");
    details.querySelector(".details-admin").before(link);
  }
  return link;
}

function hidePanel(id) {
  details.hidden = true;
  const card = cardOf(id);
  if (card && card.isConnected && !card.hidden) card.focus();
}

/** Redraw the open task's panel; `refetch`: read its full task and history again (once per
 * version). */
function renderDetails(refetch) {
  const openId = openTaskId();
  if (!openId) return;
  const shown = getTask(openId);
  if (!shown) { closeTask(); return; }
  // Until the full task arrives, or when the board has a newer version, show the board's.
  const task = detailsFull && detailsFull.id === shown.id && detailsFull.version >= shown.version ? detailsFull : shown;
  details.dataset.id = task.id;
  details.querySelector(".details-title").textContent = `${task.id}: ${task.title}`;
  const deps = (task.deps || []).map((d) => `${d} ${depDone(d) ? "✓ done" : "(not done)"}`).join(", ") || "none";
  const dl = taskFields(task, deps, resourceWait(shown), unclaimableWhy(shown.id));
  details.querySelector(".details-body").replaceChildren(dl);

  const buttons = [];
  for (const action of actionsFor(shown.stage, shown.awaiting_approval)) {
    const b = el("button", "action", action.label);
    b.type = "button";
    b.dataset.verb = action.verb;
    b.addEventListener("click", () => act(shown.id, action));
    buttons.push(b);
    const blockedBy = action.verb === "admit" ? unfinishedDeps(shown) : [];
    if (blockedBy.length) {
      // The server would refuse it (blocked): say why instead of offering it.
      const why = `Blocked: waiting for ${blockedBy.join(", ")} to complete`;
      b.disabled = true;
      b.title = why;
      const note = el("span", "action-note", why);
      note.id = "admit-blocked-note";
      b.setAttribute("aria-describedby", note.id);
      buttons.push(note);
    }
  }
  // The panel is drawn again when the full task arrives or the task changes: a keyboard user
  // on one of its buttons stays on that verb's new button, not on a button taken out of the page.
  const actions = details.querySelector(".details-actions");
  const focusedVerb = actions.contains(document.activeElement) ? document.activeElement.dataset.verb : null;
  actions.replaceChildren(...buttons);
  if (focusedVerb) {
    const same = actions.querySelector(`button[data-verb="${focusedVerb}"]:not(:disabled)`);
    (same || details.querySelector(".details-title")).focus();
  }
  const key = `${shown.id}@${shown.version}`;
  if (refetch && historyFor !== key) {
    historyFor = key;
    loadFull(shown.id, key);
    showHistory(shown.id, key);
  }
}

async function loadFull(id, key) {
  try {
    const loaded = await loadTask(id); // it lands in the model when newer than the board's
    if (!loaded || historyFor !== key) return;
    detailsFull = loaded.task;
    if (!loaded.applied) renderDetails(false); // a newer version re-renders by itself
  } catch (err) {
    // the board's copy stays shown
  }
}

async function showHistory(id, key) {
  const list = details.querySelector(".history");
  let items;
  let notes;
  let usage;
  try {
    // The notes and the usage beside the history: a card does not say whether its task has any.
    [items, notes, usage] = await Promise.all([loadHistory(id), loadNotes(id), loadUsage(id)]);
  } catch (err) {
    if (historyFor === key) list.replaceChildren(el("li", "error", String(err.message || err)));
    return;
  }
  if (historyFor !== key) return; // another task (or version) is shown now
  details.querySelector(".attempts-slot").replaceChildren(renderAttempts(items, getTask(id), notes, usage));
  list.replaceChildren(...historyItems(items)); // renews collapsed, reasons as text (timeline.js)
}

/** Follow the view (open, close), the model (the open task changed) and the actions; a click or
 * Enter on a card opens it (a link in it goes where it says); Escape closes. */
export function startDetails() {
  subscribeView((change) => {
    if (change.what === "open") showPanel(change.id);
    else if (change.what === "close") hidePanel(change.id);
  });
  subscribe((change) => {
    if (change.what === "snapshot") renderDetails(false);
    else if (change.what === "tasks" && openTaskId() !== null && change.ids.includes(openTaskId())) scheduleRedraw();
    // check()'s findings name the open task's capabilities as unclaimable, or stop naming them.
    else if (change.what === "problems" && openTaskId() !== null) scheduleRedraw();
  });
  onActed((id) => {
    if (openTaskId() === id) renderDetails(true);
  });
  const columns = document.getElementById("columns");
  columns.addEventListener("click", (e) => {
    const card = e.target.closest(".card");
    if (card && !e.target.closest("a")) openTask(card.dataset.id);
  });
  columns.addEventListener("keydown", (e) => {
    const card = e.target.closest(".card");
    if (card && e.key === "Enter" && !e.target.closest("a")) openTask(card.dataset.id);
  });
  details.querySelector(".close").addEventListener("click", closeTask);
  const cancelDialog = document.getElementById("cancel-dialog");
  document.addEventListener("keydown", (e) => {
    // Escape in the cancel dialog closes only the dialog (the browser does that).
    if (e.key === "Escape" && !cancelDialog.open) closeTask();
  });
}
