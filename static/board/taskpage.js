// The entry point of a task's own page, /board/task/<id> (templates/board/task.html, rendered by
// board/live/views.py task_page). The server wrote the header and the dependencies both ways;
// this draws the rest with the details panel's own renderers, fed by the same API calls:
//   taskfields.js  the task's fields        (GET /api/tasks/<id>)
//   attempts.js    the attempt timeline     (GET /api/tasks/<id>/events, every page)
//   timeline.js    the history, renews collapsed, paged here (HISTORY_PAGE rows a page)
//   actions.js     which operator buttons the stage has (the lifecycle's moves, board.intervene)
//   usage          each attempt's reported tokens and cost (GET /api/tasks/<id>/usage, once claimed)
//   notes          in the attempt timeline (GET /api/tasks/<id>/notes, when the task has any);
//                  staff add one with the form under it (POST, no token: board.intervene)
//   approvals      every question the task's holders asked (GET /api/tasks/<id>/approvals, when
//                  it asked any): its state, answer, values and comment; the waiting one with its
//                  answer form (approvalform.js, as the board's Needs-you lane draws it)
// An action is sent with the version shown (api.js sendAction); Cancel asks first, listing the
// tasks it would strand (the server's list, down the chain). The page reads the task again every
// few seconds while it is visible and redraws when its version moved.

import { askReason, CAN_INTERVENE, el, showMessage } from "./page.js";
import {
  addNote, loadHistory, loadNotes, loadReplays, loadTask, loadTaskApprovals, loadUsage, sendAction,
} from "./api.js";
import { answeredParts, answerForm, approversText, askedText, dueText } from "./approvalform.js";
import { actionsFor, confirmed, refusalText, withReason } from "./actions.js";
import { renderAttempts } from "./attempts.js";
import { historyItems } from "./timeline.js";
import { taskFields } from "./taskfields.js";

const HISTORY_PAGE = 100; // history rows (after collapsing renews) a page
const REFRESH_MS = 5000;

const root = document.getElementById("task-page");
const taskId = root.dataset.id;
// check()'s unclaimable_requirements text for this task when the server rendered the page, or null.
const UNCLAIMABLE = taskId ? JSON.parse(document.getElementById("unclaimable").textContent) : null;
let shown = null; // the task as last drawn
let rows = []; // the history's <li>s, oldest first
let pageEnd = 0; // rows shown: [pageEnd - HISTORY_PAGE, pageEnd)
let busy = false;

function drawTask(task) {
  shown = task;
  document.title = `${task.id}: ${task.title} — TaskFlow board`;
  root.querySelector(".details-title").textContent = `${task.id}: ${task.title}`;
  const chip = root.querySelector(".stage-chip");
  chip.textContent = task.stage;
  chip.dataset.stage = task.stage;
  // Dependencies: the server's lists; no capable agent seen: the server's words when it rendered
  // the page (shown only while the task is QUEUED).
  root.querySelector(".details-body").replaceChildren(taskFields(task, null, undefined, UNCLAIMABLE));
  drawActions(task);
}

function unfinishedDeps() {
  return [...root.querySelectorAll(".waits-on li")].filter((li) => li.dataset.stage !== "COMPLETED").map((li) => li.dataset.id);
}

function drawActions(task) {
  const buttons = [];
  for (const action of actionsFor(task.stage, task.awaiting_approval)) {
    const b = el("button", "action", action.label);
    b.type = "button";
    b.dataset.verb = action.verb;
    b.addEventListener("click", () => act(action));
    buttons.push(b);
    const blockedBy = action.verb === "admit" ? unfinishedDeps() : [];
    if (blockedBy.length) {
      const why = `Blocked: waiting for ${blockedBy.join(", ")} to complete`;
      b.disabled = true;
      b.title = why;
      buttons.push(el("span", "action-note", why));
    }
  }
  if (CAN_INTERVENE && FINISHED.has(task.stage)) {
    const again = el("button", "action", "Run again as new");
    again.type = "button";
    again.dataset.verb = "replay";
    again.title = "Create a copy of this task (same payload, dependencies and settings), linked to this one";
    again.addEventListener("click", replay);
    buttons.push(again);
  }
  root.querySelector(".details-actions").replaceChildren(...buttons);
}

// A finished task runs again as a new one (POST /api/tasks/<id>/replay): its page opens.
const FINISHED = new Set(["COMPLETED", "FAILED", "CANCELLED"]);

async function replay() {
  const sent = await sendAction(taskId, "replay", {});
  if (sent.ok && sent.body && sent.body.id) {
    window.location.assign(`/board/task/${encodeURIComponent(sent.body.id)}`);
  } else {
    showMessage(`Run again ${taskId} refused: ${(sent.body && sent.body.error && sent.body.error.message) || sent.status}`, "error");
  }
}

/** "Run again as: ..." under the header, when this task has been run again. */
async function drawReplays() {
  let ids = [];
  try {
    ids = await loadReplays(taskId);
  } catch {
    return; // the page stands without the list
  }
  const slot = root.querySelector(".replays");
  slot.hidden = ids.length === 0;
  slot.replaceChildren("Run again as: ", ...ids.flatMap((id, i) => {
    const link = el("a", null, id);
    link.href = `/board/task/${encodeURIComponent(id)}`;
    return i ? [", ", link] : [link];
  }));
}

/** Ask before cancelling: resolves to {reason} when confirmed, null when dismissed. */
function confirmCancel() {
  const dialog = document.getElementById("cancel-dialog");
  const { tasks, complete } = JSON.parse(document.getElementById("stranded").textContent);
  dialog.querySelector(".cancel-task").textContent = taskId;
  const list = dialog.querySelector(".stranded");
  list.replaceChildren(...tasks.map((t) => el("li", null, `${t.id}: ${t.title}`)));
  if (!complete) list.append(el("li", "possibly-more", "and more down the chain"));
  dialog.querySelector(".stranded-none").hidden = tasks.length > 0;
  dialog.querySelector(".stranded-some").hidden = tasks.length === 0;
  return askReason(dialog);
}

async function act(action) {
  if (action.verb === "cancel") {
    const answer = await confirmCancel();
    if (!answer) return;
    action = withReason(action, answer.reason);
  } else {
    action = await confirmed(taskId, action); // Release and Pause ask for a reason too
    if (!action) return;
  }
  const sent = await sendAction(taskId, action.path, { version: shown.version, ...action.extra });
  if (sent.ok && sent.body && sent.body.id) {
    showMessage(`${action.label}: ${taskId} is now ${sent.body.stage}`);
  } else {
    showMessage(await refusalText(taskId, action, sent), "error");
  }
  await refresh(true);
}

function drawHistoryPage() {
  const list = root.querySelector(".history");
  const start = Math.max(0, pageEnd - HISTORY_PAGE);
  list.replaceChildren(...rows.slice(start, pageEnd));
  list.start = start + 1;
  const pager = root.querySelector(".history-pager");
  pager.hidden = rows.length <= HISTORY_PAGE;
  pager.querySelector(".history-range").textContent = `rows ${start + 1}–${pageEnd} of ${rows.length}`;
  pager.querySelector(".history-older").disabled = start === 0;
  pager.querySelector(".history-newer").disabled = pageEnd >= rows.length;
}

async function drawHistory(task) {
  let events;
  let notes = [];
  let usage = null;
  try {
    [events, notes, usage] = await Promise.all([loadHistory(taskId), task.notes_count ? loadNotes(taskId) : [],
      task.attempts ? loadUsage(taskId) : null]);
  } catch (err) {
    root.querySelector(".history").replaceChildren(el("li", "error", String(err.message || err)));
    return;
  }
  root.querySelector(".attempts-slot").replaceChildren(renderAttempts(events, task, notes, usage));
  const atNewest = pageEnd === rows.length;
  rows = historyItems(events);
  if (atNewest || pageEnd > rows.length) pageEnd = rows.length; // the newest page, unless paging back
  root.querySelector(".history-count").textContent = `(${events.length} events, ${rows.length} rows)`;
  drawHistoryPage();
}

/** The task's approvals, oldest first: each question, who asked and when, and its answer (or,
 * while it waits, its form). Drawn when the task's version moves (an answer moves it). */
async function drawApprovals(task) {
  const section = root.querySelector(".task-page-approvals");
  if (!task.approvals_count) {
    section.hidden = true;
    return;
  }
  section.hidden = false;
  let approvals;
  try {
    approvals = await loadTaskApprovals(taskId);
  } catch (err) {
    const why = `could not read the approvals: ${err.message || err}`;
    section.querySelector(".approvals").replaceChildren(el("li", "error", why));
    return;
  }
  section.querySelector(".approvals-count").textContent = `(${approvals.length})`;
  section.querySelector(".approvals").replaceChildren(...approvals.map((approval) => {
    const li = el("li", `approval state-${approval.state}`);
    li.dataset.approval = String(approval.id);
    li.dataset.state = approval.state;
    const meta = el("p", "approval-meta", askedText(approval));
    const due = approval.state === "waiting" ? dueText(approval) : "";
    if (due) meta.append(" · ", el("span", "approval-due", due));
    meta.append(" · ", el("span", "approval-approvers", approversText(approval)));
    li.append(el("p", "approval-question", approval.question), meta);
    if (approval.state === "waiting") {
      li.append(answerForm(approval, {
        onAnswered: (outcome, words) => {
          showMessage(words, outcome === "already_answered" ? "error" : "info");
          refresh(true);
        },
      }));
    } else {
      li.append(...answeredParts(approval));
    }
    return li;
  }));
}

/** Read the task; redraw it and its history when its version moved (or `force`). */
async function refresh(force = false) {
  if (busy) return;
  busy = true;
  try {
    const loaded = await loadTask(taskId);
    if (!loaded) {
      showMessage(`task ${taskId} is gone (pruned)`, "error");
      return;
    }
    // A note moves no version: its count tells.
    if (force || !shown || loaded.task.version !== shown.version || loaded.task.notes_count !== shown.notes_count) {
      drawTask(loaded.task);
      await Promise.all([drawHistory(loaded.task), drawApprovals(loaded.task)]);
      if (FINISHED.has(loaded.task.stage)) await drawReplays();
    }
  } catch (err) {
    showMessage(`could not read task ${taskId}: ${err.message || err}`, "error");
  } finally {
    busy = false;
  }
}

if (taskId) {
  root.querySelector(".history-older").addEventListener("click", () => {
    pageEnd = Math.max(Math.min(HISTORY_PAGE, rows.length), pageEnd - HISTORY_PAGE);
    drawHistoryPage();
  });
  root.querySelector(".history-newer").addEventListener("click", () => {
    pageEnd = Math.min(rows.length, pageEnd + HISTORY_PAGE);
    drawHistoryPage();
  });
  const noteForm = root.querySelector(".note-form");
  if (noteForm) {
    noteForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const box = noteForm.querySelector("textarea");
      const sent = await addNote(taskId, box.value);
      if (sent.ok) {
        box.value = "";
        showMessage(`note added to ${taskId}`);
      } else {
        showMessage(`could not add the note: ${(sent.body && sent.body.error && sent.body.error.message) || sent.status}`, "error");
      }
      await refresh(true);
    });
  }
  refresh(true);
  setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
}
