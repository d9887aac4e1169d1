// The details panel of one task: every field (the full task from GET /api/tasks/<id>, since
// the socket's cards leave out the bulky ones), the operator's buttons for its stage, the
// attempt timeline (attempts.js) and the history (GET /api/tasks/<id>/events, every page).
// Opened by a click or Enter on a card, or by the URL (view.js); Escape or × closes it.

import { adminUrl, el } from "./page.js";
import { applyTask, depDone, fetchTask, prepare, tasks, unfinishedDeps } from "./store.js";
import { cards } from "./render.js";
import { writeUrl } from "./view.js";
import { act, actionsFor } from "./actions.js";
import { renderAttempts } from "./attempts.js";

const details = document.getElementById("details");
let openId = null; // the task shown, or null when the panel is closed
let historyFor = null; // "id@version" the history shown was fetched for
let detailsFull = null; // the full task from the API, for the details

export function openTaskId() {
  return openId;
}

export function openDetails(id) {
  openId = id;
  historyFor = null;
  detailsFull = null;
  details.hidden = false;
  details.querySelector(".details-admin").href = adminUrl(id);
  renderDetails(true);
  // Keyboard users land in the panel (its heading; Tab goes on to the actions), and go back
  // to the card they came from when it closes.
  details.querySelector(".details-title").focus();
  writeUrl("push");
}

export function closeDetails() {
  if (openId === null) return;
  const id = openId;
  openId = null;
  details.hidden = true;
  const card = cards.get(id);
  if (card && card.isConnected && !card.hidden) card.focus();
  writeUrl("push");
}

function field(dl, name, value, pre = false) {
  dl.append(el("dt", null, name));
  const dd = el("dd");
  if (pre) dd.append(el("pre", null, value));
  else dd.textContent = value;
  dl.append(dd);
}

function json(value) {
  return value === null || value === undefined ? "—" : JSON.stringify(value, null, 2);
}

/** Redraw the open task's panel; `refetch`: read its full task and history again (once per
 * version). */
export function renderDetails(refetch) {
  if (!openId) return;
  const shown = tasks.get(openId);
  if (!shown) { closeDetails(); return; }
  // Until the full task arrives, or when the board has a newer version, show the board's.
  const task = detailsFull && detailsFull.id === shown.id && detailsFull.version >= shown.version ? detailsFull : shown;
  details.dataset.id = task.id;
  details.querySelector(".details-title").textContent = `${task.id}: ${task.title}`;
  const dl = el("dl");
  field(dl, "stage", `${task.stage} (version ${task.version}) since ${new Date(task.inStageSinceMs).toLocaleString()}`);
  field(dl, "owner", task.owner || "—");
  field(dl, "queue / priority", `${task.queue} / ${task.priority}`);
  field(dl, "attempts", `${task.attempts} of ${task.max_retries + 1}`);
  field(dl, "fence", String(task.fence));
  if (task.lease_expires_at) field(dl, "lease until", new Date(task.leaseExpiresMs).toLocaleString());
  if (task.not_before) field(dl, "not before", new Date(task.not_before).toLocaleString());
  field(dl, "dependencies", (task.deps || []).map((d) => `${d} ${depDone(d) ? "✓ done" : "(not done)"}`).join(", ") || "none");
  field(dl, "description", task.description || "—", true);
  field(dl, "payload", json(task.payload), true);
  field(dl, "checkpoint", json(task.checkpoint), true);
  field(dl, "progress", task.progress === null || task.progress === undefined ? "—" : `${Math.round(task.progress * 100)}%`);
  if (task.result !== null && task.result !== undefined) field(dl, "result", json(task.result), true);
  if (task.error) field(dl, "last error", task.error, true);
  field(dl, "created / updated", `${new Date(task.createdMs).toLocaleString()} / ${new Date(task.updatedMs).toLocaleString()}`);
  details.querySelector(".details-body").replaceChildren(dl);

  const buttons = [];
  for (const action of actionsFor(shown.stage)) {
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
    loadHistory(shown.id, key);
  }
}

async function loadFull(id, key) {
  try {
    const found = await fetchTask(id);
    if (!found) return;
    const task = prepare(found);
    if (historyFor !== key) return;
    detailsFull = task;
    if (!applyTask(task)) renderDetails(false); // a newer version re-renders by itself
  } catch (err) {
    // the board's copy stays shown
  }
}

async function loadHistory(id, key) {
  const list = details.querySelector(".history");
  const items = [];
  let cursor = null;
  try {
    for (let page = 0; page < 20; page++) {
      const url = `/api/tasks/${encodeURIComponent(id)}/events?limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
      const response = await fetch(url, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`history: HTTP ${response.status}`);
      const body = await response.json();
      items.push(...body.items);
      cursor = body.next;
      if (!cursor) break;
    }
  } catch (err) {
    if (historyFor === key) list.replaceChildren(el("li", "error", String(err.message || err)));
    return;
  }
  if (historyFor !== key) return; // another task (or version) is shown now
  details.querySelector(".attempts-slot").replaceChildren(renderAttempts(items, tasks.get(id)));
  list.replaceChildren(...items.map((e) => {
    const li = el("li", "history-item");
    li.dataset.verb = e.verb;
    li.append(
      el("time", null, new Date(e.at).toLocaleString()), " ",
      el("strong", null, e.verb), ` ${e.from_stage || "∅"} → ${e.to_stage} · v${e.version} · fence ${e.fence}`,
      e.actor ? ` · ${e.actor}` : "",
    );
    if (e.detail) li.append(el("pre", "detail", JSON.stringify(e.detail)));
    return li;
  }));
}

/** A click or Enter on a card opens it (a link in it goes where it says); Escape closes. */
export function startDetails() {
  const columns = document.getElementById("columns");
  columns.addEventListener("click", (e) => {
    const card = e.target.closest(".card");
    if (card && !e.target.closest("a")) openDetails(card.dataset.id);
  });
  columns.addEventListener("keydown", (e) => {
    const card = e.target.closest(".card");
    if (card && e.key === "Enter" && !e.target.closest("a")) openDetails(card.dataset.id);
  });
  details.querySelector(".close").addEventListener("click", closeDetails);
  const cancelDialog = document.getElementById("cancel-dialog");
  document.addEventListener("keydown", (e) => {
    // Escape in the cancel dialog closes only the dialog (the browser does that).
    if (e.key === "Escape" && !cancelDialog.open) closeDetails();
  });
}
