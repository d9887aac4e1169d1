// Bulk actions on the board's filter (issue 33, item 1; docs/bulk.md). Beside the filter boxes, a
// user who may intervene (data-can-intervene) gets "Act on all N matching…" whenever a filter is
// set: it opens the bulk dialog, which asks the server for the count of the chosen action
// (POST /api/bulk with dry_run: "cancel 12,408 tasks in queue ci-*", over every task, not only
// the cards loaded) and confirms with that sentence on its button. The job then runs on the
// server; its progress comes over the socket ("bulk" frames, landed in the model by socket.js)
// and is drawn in the bulk panel above the columns: a progress bar, done / skipped / lost, a Stop
// button, and the summary when it ends. A job another operator started (or this page, before a
// reload) is shown the same way when its frames come and the page follows no other.
//
// What a test or a person may read: button#bulk-open; the dialog #bulk-dialog with
// select[name=action], p.bulk-count (data-total once counted) and button.bulk-confirm; the panel
// section#bulk with data-job, data-state, data-total, data-done, data-skipped, data-lost and
// data-updates (how many reports of the job it drew), its progress element, button.bulk-stop and
// p.bulk-summary.

import { CAN_INTERVENE, frameBatcher, showMessage } from "./page.js";
import { countIn, getBulkJob, subscribe } from "./store.js";
import { loadBulkJob, sendBulk, stopBulk } from "./api.js";
import { currentFilter, currentStage, matchingCounts, subscribeView } from "./view.js";

const openButton = document.getElementById("bulk-open");
const dialog = document.getElementById("bulk-dialog");
const panel = document.getElementById("bulk");
const FINISHED = new Set(["stopped", "done", "failed"]);
const DONE_WORDS = {
  retry: "retried", requeue: "requeued", cancel: "cancelled", pause: "paused", admit: "admitted",
  "release-stale": "released", "set-priority": "re-prioritised", "add-tag": "tagged", replay: "run again as new",
};
const FALLBACK_POLL_MS = 5000; // the job's row, read now and then: a frame lost in a reconnection
let jobId = null;
let counting = 0; // the latest count request: only its answer is drawn
let pollTimer = null;
let updates = 0;

const fmt = (n) => Number(n).toLocaleString("en-US");
const capitalised = (text) => text.charAt(0).toUpperCase() + text.slice(1);

/** The board's filter as the API's bulk filter, or null when none is set. */
function apiFilter() {
  const f = currentFilter();
  const stage = currentStage();
  const out = {};
  if (f) {
    for (const name of ["text", "owner", "queue", "search"]) if (f[name]) out[name] = f[name];
  }
  if (stage) out.stage = stage;
  return Object.keys(out).length ? out : null;
}

/** How many tasks the filter matches, as the board counts them (every stage's, or the stage shown). */
function matchingTotal() {
  const stage = currentStage();
  const counts = matchingCounts();
  if (!counts) return stage ? countIn(stage) : null;
  return stage ? counts[stage] : Object.values(counts).reduce((a, b) => a + b, 0);
}

function drawButton() {
  const filter = CAN_INTERVENE ? apiFilter() : null;
  openButton.hidden = !filter;
  if (!filter) return;
  const n = matchingTotal();
  openButton.textContent = n === null || n === undefined ? "Act on all matching…" : `Act on all ${fmt(n)} matching…`;
}

// -- the dialog: choose, count, confirm ------------------------------------------------------------

function fields(form) {
  const action = form.elements.action.value;
  const body = { filter: apiFilter(), action, reason: form.elements.reason.value.trim() };
  if (action === "set-priority") body.priority = Number.parseInt(form.elements.priority.value, 10);
  if (action === "add-tag") body.tag = form.elements.tag.value.trim();
  return body;
}

async function recount() {
  const form = dialog.querySelector("form");
  const action = form.elements.action.value;
  form.querySelector(".bulk-priority").hidden = action !== "set-priority";
  form.querySelector(".bulk-tag").hidden = action !== "add-tag";
  const countEl = form.querySelector(".bulk-count");
  const confirm = form.querySelector(".bulk-confirm");
  const body = fields(form);
  confirm.disabled = true;
  delete countEl.dataset.total;
  if (action === "set-priority" && !Number.isInteger(body.priority)) {
    countEl.textContent = "Give the new priority.";
    return;
  }
  if (action === "add-tag" && !body.tag) {
    countEl.textContent = "Give the tag to add.";
    return;
  }
  const mine = ++counting;
  countEl.textContent = "counting…";
  const sent = await sendBulk({ ...body, reason: "", dry_run: true });
  if (mine !== counting) return; // a later choice asked again
  if (!sent.ok) {
    countEl.textContent = sent.body?.error?.message || `HTTP ${sent.status}`;
    return;
  }
  const { total, matching, description } = sent.body;
  countEl.dataset.total = String(total);
  const others = matching - total;
  countEl.textContent = `${capitalised(description)}.` + (others > 0
    ? ` ${fmt(others)} more match${others === 1 ? "es" : ""} but ${others === 1 ? "is" : "are"} not in a stage this applies to.`
    : "");
  confirm.textContent = total ? capitalised(description) : "Nothing to do";
  confirm.disabled = total === 0;
}

function openDialog() {
  const form = dialog.querySelector("form");
  form.elements.reason.value = "";
  dialog.returnValue = "";
  dialog.showModal();
  recount();
}

async function confirmed() {
  if (dialog.returnValue !== "confirm") return;
  const sent = await sendBulk(fields(dialog.querySelector("form")));
  if (!sent.ok) {
    showMessage(`bulk action refused: ${sent.body?.error?.message || `HTTP ${sent.status}`}`, "error");
    return;
  }
  follow(sent.body.id);
}

// -- the panel: progress, Stop, summary -----------------------------------------------------------

function follow(id) {
  jobId = id;
  updates = 0;
  panel.querySelector(".bulk-stop").disabled = false;
  clearInterval(pollTimer);
  pollTimer = setInterval(() => {
    const job = getBulkJob(jobId);
    if (job && FINISHED.has(job.state)) clearInterval(pollTimer);
    else loadBulkJob(jobId).catch(() => {});
  }, FALLBACK_POLL_MS);
  drawPanel();
}

function summary(job) {
  const reasons = Object.entries(job.skipped_reasons || {}).map(([why, n]) => `${why.replaceAll("_", " ")} ${fmt(n)}`);
  const reached = job.done + job.skipped + job.lost;
  const head = job.state === "stopped" ? `Stopped after ${fmt(reached)} of ${fmt(job.total)} tasks.`
    : job.state === "failed" ? `Failed after ${fmt(reached)} of ${fmt(job.total)} tasks: ${job.error || "see the server's log"}.`
      : `Finished: ${fmt(job.total)} tasks.`;
  const problems = job.problems === null || job.problems === undefined ? ""
    : ` Check: ${job.problems === 0 ? "no problem" : `${fmt(job.problems)} problem${job.problems === 1 ? "" : "s"}`} on the board.`;
  return `${head} ${capitalised(DONE_WORDS[job.action] || "done")}: ${fmt(job.done)}. Skipped: ${fmt(job.skipped)}`
    + `${reasons.length ? ` (${reasons.join(", ")})` : ""}. Lost a race (changed meanwhile, left as they were): `
    + `${fmt(job.lost)}.${problems}`;
}

function drawPanel() {
  const job = jobId === null ? null : getBulkJob(jobId);
  if (!job) return;
  updates++;
  panel.hidden = false;
  const reached = job.done + job.skipped + job.lost;
  Object.assign(panel.dataset, {
    job: String(job.id), state: job.state, total: String(job.total), done: String(job.done),
    skipped: String(job.skipped), lost: String(job.lost), updates: String(updates),
  });
  panel.querySelector(".bulk-what").textContent =
    `Bulk ${job.action} by ${job.actor} — ${job.state}${job.state === "stopping" ? " (after the task it is on)" : ""}`;
  const bar = panel.querySelector("progress");
  bar.max = Math.max(job.total, 1);
  bar.value = job.total ? reached : 1;
  panel.querySelector(".bulk-figures").textContent =
    `${fmt(reached)} / ${fmt(job.total)} · ${fmt(job.done)} done · ${fmt(job.skipped)} skipped · ${fmt(job.lost)} lost a race`;
  const finished = FINISHED.has(job.state);
  panel.querySelector(".bulk-stop").hidden = finished;
  panel.querySelector(".bulk-close").hidden = !finished;
  const summaryEl = panel.querySelector(".bulk-summary");
  summaryEl.hidden = !finished;
  if (finished) {
    summaryEl.textContent = summary(job);
    clearInterval(pollTimer);
  }
}

export function startBulk() {
  if (!CAN_INTERVENE) return;
  const redrawButton = frameBatcher(drawButton);
  subscribeView(redrawButton);
  subscribe((change) => {
    if (change.what === "bulk") {
      // Another operator's job (or this page's, before a reload) running: shown too, when this
      // page follows none.
      const job = getBulkJob(change.id);
      if (jobId === null && job && !FINISHED.has(job.state)) follow(change.id);
      else if (change.id === jobId) drawPanel();
    } else if (change.what === "snapshot" || change.what === "tasks") {
      redrawButton();
    }
  });
  openButton.addEventListener("click", openDialog);
  const form = dialog.querySelector("form");
  form.elements.action.addEventListener("change", recount);
  form.elements.priority.addEventListener("change", recount);
  form.elements.tag.addEventListener("change", recount);
  dialog.addEventListener("close", confirmed);
  panel.querySelector(".bulk-stop").addEventListener("click", async (event) => {
    event.currentTarget.disabled = true;
    const sent = await stopBulk(jobId);
    if (!sent.ok) {
      event.currentTarget.disabled = false;
      showMessage(`could not stop the job: ${sent.body?.error?.message || `HTTP ${sent.status}`}`, "error");
    }
  });
  panel.querySelector(".bulk-close").addEventListener("click", () => {
    panel.hidden = true;
    jobId = null;
  });
  drawButton();
}
