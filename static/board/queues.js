// The queues strip above the columns (<section id="queues">), fed only by the board's websocket:
// socket.js puts each {"type": "queues", ...} frame (board/live/frames.py, pushed by the server's
// tailer when it changes) in the model, and the strip redraws from it. Each queue says how many
// of its tasks run against its limit ("ci 2/3 running"), how many wait, and, when paused, by
// whom and why. A user with board.change_queue (data-can-change-queues) gets a Pause/Resume
// button per queue, and a Limits button (its concurrency limit and rate: limits.js's dialog).
// Pause asks for a reason (the dialog), Resume is one click; all three PUT
// /api/queues/{name} (api.js), and the new state comes back over the socket, as every other
// open board sees it.
//
// What a test or a person may read: each queue is li.queue[data-queue] with data-paused
// ("true"/"false"), data-running, data-limit ("" without one) and data-queued; its button is
// button.queue-toggle (data-pending="true" while its request or the frame that answers it is
// on the way), and button.queue-limits. A fairness key with a budget is li.fairness-key
// [data-fairness-key] with data-budget-spent and button.fairness-budget (PUT
// /api/fairness-keys/{name}). The section's data-updates counts the frames drawn.

import { askReason, CAN_CHANGE_QUEUES, el, rateText, showMessage } from "./page.js";
import { getQueues, subscribe } from "./store.js";
import { changeFairnessKey, changeQueue } from "./api.js";
import { askLimits } from "./limits.js";

const section = document.getElementById("queues");
const dialog = document.getElementById("queue-dialog");
// Queue name -> the paused state asked for, until a frame shows it or the request failed: the
// button stays disabled meanwhile (a second click would ask for the same change again).
const pending = new Map();
// Queues whose limits request is on the way: their Limits button is disabled until it is answered.
const limitsPending = new Set();
let updates = 0;
const PENDING_MS = 10000;

function runningText(q) {
  return q.concurrency === null ? `${q.running} running` : `${q.running}/${q.concurrency} running`;
}

/** A budget (board.engine.budgets) of a queue or a fairness key: the window's spend against
 * it, red once spent; `button` names the button that raises it. */
function budgetText(q, what, button) {
  const parts = [];
  if (q.budget.tokens !== null) parts.push(`${q.spent.tokens.toLocaleString()}/${q.budget.tokens.toLocaleString()} tokens`);
  if (q.budget.cost_usd !== null) parts.push(`$${q.spent.cost_usd.toFixed(2)}/$${q.budget.cost_usd}`);
  const per = q.budget.per === "total" ? "in total" : `this ${q.budget.per}`;
  const budget = el("span", q.budget_exhausted ? "queue-budget spent" : "queue-budget",
    `${parts.join(", ")} ${per}${q.budget_exhausted ? ": budget spent" : ""}`);
  budget.title = q.budget_exhausted
    ? `no claim starts${q.budget_exhausted_until ? ` until ${new Date(q.budget_exhausted_until).toLocaleString()}` : ""}; raise the budget with ${button}`
    : `the usage its tasks reported against the ${what}'s budget`;
  return budget;
}

/** A fairness key with a budget (issue 32, item 5): li.fairness-key[data-fairness-key] with
 * data-budget-spent, and a Budget button (button.fairness-budget) for a user who may change
 * queues. */
function fairnessKeyItem(k) {
  const li = el("li", "queue fairness-key");
  li.dataset.fairnessKey = k.name;
  li.dataset.budgetSpent = String(k.budget_exhausted);
  li.append(el("b", "queue-name", `key ${k.name}`), " · ", budgetText(k, "fairness key", "Budget"));
  if (CAN_CHANGE_QUEUES) {
    const button = el("button", "fairness-budget", "Budget");
    button.type = "button";
    button.dataset.fairnessKey = k.name;
    button.title = `set the budget of fairness key ${k.name}`;
    if (limitsPending.has(`key:${k.name}`)) button.disabled = true;
    li.append(" ", button);
  }
  return li;
}

function queueItem(q) {
  const li = el("li", "queue");
  li.dataset.queue = q.name;
  li.dataset.paused = String(q.paused);
  li.dataset.running = String(q.running);
  li.dataset.limit = q.concurrency === null ? "" : String(q.concurrency);
  li.dataset.queued = String(q.queued);
  const full = q.concurrency !== null && q.running >= q.concurrency;
  li.append(el("b", "queue-name", q.name), " ", el("span", full ? "queue-running full" : "queue-running", runningText(q)),
    " · ", el("span", "queue-queued", `${q.queued} queued`));
  if (q.rate) {
    const rate = el("span", "queue-rate", rateText(q.rate));
    rate.title = `at most ${q.rate.count} claims start in any ${q.rate.per_seconds} s, spaced evenly`;
    li.append(" · ", rate);
  }
  if (q.budget) {
    li.dataset.budgetSpent = String(q.budget_exhausted);
    li.append(" · ", budgetText(q, "queue", "Limits"));
  }
  if (q.paused) {
    const note = el("span", "queue-paused",
      `paused by ${q.paused_by || "?"}${q.paused_reason ? `: ${q.paused_reason}` : ""}`);
    if (q.paused_at) note.title = `since ${new Date(q.paused_at).toLocaleString()}`;
    li.append(" ", note);
  }
  if (CAN_CHANGE_QUEUES) {
    const button = el("button", "queue-toggle", q.paused ? "Resume" : "Pause");
    button.type = "button";
    button.dataset.queue = q.name;
    button.dataset.pause = String(!q.paused);
    button.title = q.paused ? `let agents claim from ${q.name} again` : `stop agents claiming from ${q.name}`;
    if (pending.has(q.name)) {
      button.disabled = true;
      button.dataset.pending = "true";
    }
    const limits = el("button", "queue-limits", "Limits");
    limits.type = "button";
    limits.dataset.queue = q.name;
    limits.title = `set the concurrency limit, rate and budget of ${q.name}`;
    if (limitsPending.has(q.name)) limits.disabled = true;
    li.append(" ", button, " ", limits);
  }
  return li;
}

function render() {
  const frame = getQueues();
  if (!frame) return;
  // A request answered by this frame is no longer pending.
  for (const q of frame.queues) if (pending.get(q.name) === q.paused) pending.delete(q.name);
  section.dataset.updates = String(updates);
  const items = frame.queues.map(queueItem);
  if (!items.length) items.push(el("li", "empty", "No queue has unfinished tasks or settings."));
  if (frame.more_queues) items.push(el("li", "empty", `and ${frame.more_queues} more queues (GET /api/queues)`));
  items.push(...(frame.fairness_keys || []).map(fairnessKeyItem));
  if (frame.more_fairness_keys) {
    items.push(el("li", "empty", `and ${frame.more_fairness_keys} more fairness keys with a budget (GET /api/fairness-keys)`));
  }
  section.querySelector("ul").replaceChildren(...items);
}

/** Ask for a reason before pausing `name`: resolves to {reason} when confirmed, null when dismissed. */
function askPause(name) {
  dialog.querySelector(".queue-name").textContent = name;
  return askReason(dialog);
}

async function toggle(name, pause) {
  let fields = { paused: false };
  if (pause) {
    const answer = await askPause(name);
    if (!answer) return;
    fields = { paused: true, reason: answer.reason };
  }
  pending.set(name, pause);
  render();
  const { ok, status, body } = await changeQueue(name, fields);
  if (!ok) {
    pending.delete(name);
    render();
    const why = (body && body.error && body.error.message) || `HTTP ${status}`;
    showMessage(`could not ${pause ? "pause" : "resume"} queue ${name}: ${why}`, "error");
    return;
  }
  // Already in that state (no frame will change it): nothing to wait for. Otherwise the frame
  // that shows it ends the wait, or, should none come (the queue left the strip), a timeout.
  if (getQueues()?.queues.some((q) => q.name === name && q.paused === pause)) {
    pending.delete(name);
    render();
  } else {
    setTimeout(() => { if (pending.get(name) === pause) { pending.delete(name); render(); } }, PENDING_MS);
  }
  showMessage(`queue ${name} ${pause ? "paused" : "resumed"}`);
}

/** The Limits button: the dialog (limits.js), then PUT /api/queues/{name}; the strip shows the
 * new limits from the next frame, as every other open board does. */
async function setLimits(name) {
  const q = getQueues()?.queues.find((item) => item.name === name);
  if (!q) return;
  const fields = await askLimits(q);
  if (!fields) return;
  limitsPending.add(name);
  render();
  const { ok, status, body } = await changeQueue(name, fields);
  limitsPending.delete(name);
  render();
  if (!ok) {
    const why = (body && body.error && body.error.message) || `HTTP ${status}`;
    showMessage(`could not change the limits of queue ${name}: ${why}`, "error");
    return;
  }
  showMessage(`queue ${name}: limits saved`);
}

/** A fairness key's Budget button: the limits dialog with its budget only, then PUT
 * /api/fairness-keys/{name}; the strip shows the new budget from the next frame. */
async function setKeyBudget(name) {
  const k = getQueues()?.fairness_keys?.find((item) => item.name === name);
  if (!k) return;
  const fields = await askLimits(k, { budgetOnly: true });
  if (!fields) return;
  limitsPending.add(`key:${name}`);
  render();
  const { ok, status, body } = await changeFairnessKey(name, { budget: fields.budget, reason: fields.reason });
  limitsPending.delete(`key:${name}`);
  render();
  if (!ok) {
    const why = (body && body.error && body.error.message) || `HTTP ${status}`;
    showMessage(`could not change the budget of fairness key ${name}: ${why}`, "error");
    return;
  }
  showMessage(`fairness key ${name}: budget saved`);
}

/** Redraw on each "queues" frame; wire the Pause/Resume, Limits and Budget buttons. */
export function startQueues() {
  subscribe((change) => {
    if (change.what !== "queues") return;
    updates += 1;
    render();
  });
  section.addEventListener("click", (e) => {
    const limits = e.target.closest("button.queue-limits");
    if (limits && !limits.disabled) setLimits(limits.dataset.queue);
    const budget = e.target.closest("button.fairness-budget");
    if (budget && !budget.disabled) setKeyBudget(budget.dataset.fairnessKey);
    const button = e.target.closest("button.queue-toggle");
    if (!button || button.disabled) return;
    toggle(button.dataset.queue, button.dataset.pause === "true");
  });
}
