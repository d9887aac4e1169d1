// The operator's actions: the buttons of the details panel and drag and drop between columns,
// offered only to a user who may intervene (data-can-intervene) and only where the lifecycle
// has the move (the page's MOVES). Each POSTs /api/tasks/<id>/<verb> (api.js) with the version
// the card shows, so a move that lost a race is refused (409) and the card goes back to where
// the server says it is (api.js lands the task the refusal names). An accepted move is not
// applied here: the socket brings the change, as it does every other one, and the card, shown
// in its new column meanwhile, is drawn from it. Cancel asks first (the dialog): a reason for
// the history, and which waiting tasks it would strand; Release and Pause, which take a holder's
// lease away, ask for a reason too (`confirmed`). A move refused because the task changed says
// what changed it (`refusalText`: the task's last move, who made it and when).

import { askReason, CAN_INTERVENE, COLUMN_ELS, el, MOVES, showMessage, STAGES } from "./page.js";
import { getTask, strandedBy } from "./store.js";
import { lastEvent, sendAction } from "./api.js";
import { cardOf, cardsOf, detach, markDirty, newChunk } from "./render.js";

// The operator's verbs and their endpoints. FAILED -> QUEUED is offered as "retry": a requeue
// that also gives the task its attempts back (a FAILED task usually has none left).
const HUMAN_VERBS = {
  admit: { path: "admit", label: "Admit" },
  requeue: { path: "requeue", label: "Requeue" },
  force_release: { path: "force-release", label: "Release" },
  force_pause: { path: "force-pause", label: "Pause" },
  cancel: { path: "cancel", label: "Cancel" },
};

/** The human actions the lifecycle allows from `stage`: [{verb, to, path, label, extra}]. */
function allowedFrom(stage) {
  if (!CAN_INTERVENE) return [];
  const out = [];
  for (const [from, verb, to] of MOVES) {
    if (from !== stage || !HUMAN_VERBS[verb]) continue;
    const action = { verb, to, ...HUMAN_VERBS[verb], extra: {} };
    if (verb === "requeue" && stage === "FAILED") {
      action.label = "Retry";
      action.extra = { reset_attempts: true };
    }
    out.push(action);
  }
  return out;
}

const ACTIONS = new Map(STAGES.map((s) => [s, allowedFrom(s)]));

/** The actions offered for a task in `stage` (none to a user who may not intervene). A task
 * waiting for an answer to its approval (`awaitingApproval`) is moved by the answer: the engine
 * refuses requeue and resume, so only Cancel is offered (the Needs-you lane answers it). */
export function actionsFor(stage, awaitingApproval = false) {
  const actions = ACTIONS.get(stage) || [];
  return awaitingApproval ? actions.filter((a) => a.verb === "cancel") : actions;
}

const actedListeners = [];

/** `listener(id)` is called once an action on task `id` has its answer (details.js redraws the
 * panel of the open task). */
export function onActed(listener) {
  actedListeners.push(listener);
}

// ------------------------------------------------------------------------------------------
// Cancel asks first: a reason for the history, and which waiting tasks it strands

const cancelDialog = document.getElementById("cancel-dialog");

/** Ask before cancelling `id`: resolves to {reason} when confirmed, null when dismissed. */
function confirmCancel(id) {
  const { ids, complete } = strandedBy(id);
  cancelDialog.querySelector(".cancel-task").textContent = id;
  const list = cancelDialog.querySelector(".stranded");
  const shown = ids.slice(0, 50);
  list.replaceChildren(...shown.map((d) => el("li", null, `${d}: ${getTask(d).title}`)));
  if (ids.length > shown.length) list.append(el("li", null, `and ${ids.length - shown.length} more`));
  if (!complete) list.append(el("li", "possibly-more", "and possibly more (the board has not loaded every task)"));
  cancelDialog.querySelector(".stranded-none").hidden = ids.length > 0 || !complete;
  cancelDialog.querySelector(".stranded-some").hidden = ids.length === 0 && complete;
  return askReason(cancelDialog);
}

/** `action` with the operator's reason in what it sends (none given: nothing added). */
export function withReason(action, reason) {
  return reason ? { ...action, extra: { ...action.extra, reason } } : action;
}

// Moves that take a holder's lease away ask first, as Cancel does: the reason goes to the history.
const ASKS_A_REASON = {
  force_release: {
    title: "Release", confirm: "Release the task",
    text: "Its holder loses the lease (its next renew or complete is refused) and the task goes back to QUEUED.",
  },
  force_pause: {
    title: "Pause", confirm: "Pause the task",
    text: "Its holder loses the lease and the task waits in PAUSED, with its last checkpoint, until it is resumed.",
  },
};

/** Ask for a reason before `action` on task `id` when the move takes a lease away (the page's
 * #reason-dialog): resolves to the action with the reason, the action as it is when the move
 * asks nothing, or null when dismissed. */
export async function confirmed(id, action) {
  const asks = ASKS_A_REASON[action.verb];
  if (!asks) return action;
  const dialog = document.getElementById("reason-dialog");
  dialog.querySelector(".reason-title").textContent = `${asks.title} ${id}?`;
  dialog.querySelector(".reason-text").textContent = asks.text;
  dialog.querySelector("button[value=confirm]").textContent = asks.confirm;
  const answer = await askReason(dialog);
  return answer && withReason(action, answer.reason);
}

// A history row's verb as what happened to the task ("already admitted by ops-1 at 05:21:50").
const DONE = {
  create: "created", admit: "admitted", claim: "claimed", resume: "resumed", renew: "renewed",
  release: "released", force_release: "released", complete: "completed", fail: "failed",
  retry: "queued for a retry", pause: "paused", force_pause: "paused", requeue: "requeued",
  cancel: "cancelled", reclaim: "taken back (lease expired)", edit: "edited", expire: "failed (not started in time)",
};

/** What to say when `action` on `id` was refused (`sent`: sendAction's answer). A version
 * conflict means someone moved the task first: say who, what and when (its last history row)
 * rather than the versions. */
export async function refusalText(id, action, sent) {
  const error = (sent.body && sent.body.error) || {};
  if (error.code === "version_conflict" && error.task) {
    try {
      const last = await lastEvent(id);
      if (last) {
        const when = new Date(last.at).toLocaleTimeString();
        return `${action.label} ${id}: not done; it was ${DONE[last.verb] || last.verb} by ${last.actor} at ${when} meanwhile (now ${error.task.stage})`;
      }
    } catch { /* no history to tell: the refusal's own words below */ }
  }
  const what = error.message || (sent.status !== null ? `HTTP ${sent.status}` : "no answer");
  return `${action.label} ${id} refused: ${what}`;
}

/** Send `action` for task `id`; the card waits in the target column until the answer. */
export async function act(id, action) {
  const task = getTask(id);
  if (!task) return;
  if (action.verb === "cancel") {
    const answer = await confirmCancel(id);
    if (!answer) return; // dismissed: nothing sent, nothing moved
    action = withReason(action, answer.reason);
  } else {
    action = await confirmed(id, action);
    if (!action) return;
  }
  const card = cardOf(id);
  if (card) {
    card.classList.add("pending");
    if (action.to !== task.stage) { // shown where it is going until the server answers
      detach(card);
      const container = cardsOf(action.to);
      // (not into a chunk that holds ids in place of its cards: render.js, virtualized columns)
      if (!container.firstElementChild || container.firstElementChild.hollowIds) container.prepend(newChunk(1));
      container.firstElementChild.prepend(card);
    }
  }
  const sent = await sendAction(id, action.path, { version: task.version, ...action.extra });
  card?.classList.remove("pending");
  if (sent.ok && sent.body && sent.body.id) {
    showMessage(`${action.label}: ${id} is now ${sent.body.stage}`);
  } else {
    markDirty(id); // back where the model says it is
    showMessage(await refusalText(id, action, sent), "error");
  }
  for (const listener of actedListeners) listener(id);
}

// ------------------------------------------------------------------------------------------
// Drag and drop: a card onto a column its stage has a move to

let dragging = null; // {id, targets: Map stage -> action}

function clearDropTargets() {
  for (const column of COLUMN_ELS.values()) column.classList.remove("drop-ok", "drop-over", "drop-no");
  document.body.classList.remove("dragging");
}

export function startDragAndDrop() {
  if (!CAN_INTERVENE) return;
  const columns = document.getElementById("columns");
  columns.addEventListener("dragstart", (e) => {
    const card = e.target.closest?.(".card");
    const task = card && getTask(card.dataset.id);
    if (!task) return;
    const targets = new Map(actionsFor(task.stage, task.awaiting_approval).map((a) => [a.to, a]));
    dragging = { id: task.id, targets };
    e.dataTransfer.effectAllowed = "move";
    e.dataTransfer.setData("text/plain", task.id);
    document.body.classList.add("dragging");
    for (const [stage, column] of COLUMN_ELS) {
      column.classList.add(targets.has(stage) ? "drop-ok" : "drop-no");
    }
  });
  columns.addEventListener("dragend", () => {
    dragging = null;
    clearDropTargets();
  });
  for (const [stage, column] of COLUMN_ELS) {
    column.addEventListener("dragover", (e) => {
      if (!dragging || !dragging.targets.has(stage)) return; // not offered: the drop is refused
      e.preventDefault();
      e.dataTransfer.dropEffect = "move";
      column.classList.add("drop-over");
    });
    column.addEventListener("dragleave", (e) => {
      if (!column.contains(e.relatedTarget)) column.classList.remove("drop-over");
    });
    column.addEventListener("drop", (e) => {
      if (!dragging || !dragging.targets.has(stage)) return;
      e.preventDefault();
      const { id, targets } = dragging;
      dragging = null;
      clearDropTargets();
      act(id, targets.get(stage));
    });
  }
}
