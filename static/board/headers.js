// The queues' figures under the QUEUED and RUNNING column headers (issue 29), from the model's
// "queues" frame. A board may have 30 queues, and a column is 168 px wide: each header names at
// most SHOWN queues, those that matter most, then "+n more"; its title (hover) lists them all,
// and the queues strip above the columns has every figure.
//   QUEUED:  the queues that take no claim now, the reason why their cards wait: "held: docs
//            paused · ci 3/3 · api rate · llm budget" (paused, at the limit, waiting for its rate's
//            next claim, its budget spent).
//   RUNNING: the queues with a limit, the fullest first: "limits: ci 3/3 · web 1/2".
// A queue open for claims and without a limit is in neither.
//
// What a test or a person may read: p.queue-summary[data-queues] under each of the two headers,
// its data-queues the names it counts (comma-separated, all of them, not only those shown).

import { COLUMN_ELS, el } from "./page.js";
import { closedQueueList, getQueues, subscribe } from "./store.js";

const SHOWN = 3;

function summaryEl(stage) {
  const column = COLUMN_ELS.get(stage);
  const p = el("p", "queue-summary");
  p.hidden = true;
  column.querySelector("h2").after(p);
  return p;
}

/** `items`: [name, short figure, full reason], most important first. */
function fill(p, label, items) {
  p.hidden = items.length === 0;
  p.dataset.queues = items.map(([name]) => name).join(",");
  const shown = items.slice(0, SHOWN).map(([name, figure]) => `${name} ${figure}`);
  if (items.length > SHOWN) shown.push(`+${items.length - SHOWN} more`);
  p.textContent = items.length ? `${label}: ${shown.join(" · ")}` : "";
  p.title = items.map(([, , why]) => why).join("\n");
}

function held(byName) {
  return closedQueueList().map(([name, why]) => {
    const q = byName.get(name);
    if (!q || q.paused) return [name, "paused", why];
    if (q.budget_exhausted) return [name, "budget", why];
    const full = q.concurrency !== null && q.running >= q.concurrency;
    return [name, full ? `${q.running}/${q.concurrency}` : "rate", why];
  }).sort((a, b) => (a[1] === "paused") === (b[1] === "paused") ? a[0].localeCompare(b[0]) : a[1] === "paused" ? -1 : 1);
}

function limited(queues) {
  return queues.filter((q) => q.concurrency !== null)
    .sort((a, b) => b.running / b.concurrency - a.running / a.concurrency || a.name.localeCompare(b.name))
    .map((q) => [q.name, `${q.running}/${q.concurrency}`, `${q.name}: ${q.running} running, at most ${q.concurrency}`]);
}

/** Fill the two headers on each "queues" frame, and when a queue opens or closes (a rate's time). */
export function startHeaders() {
  const queuedEl = summaryEl("QUEUED");
  const runningEl = summaryEl("RUNNING");
  const draw = () => {
    const frame = getQueues();
    if (!frame) return;
    fill(queuedEl, "held", held(new Map(frame.queues.map((q) => [q.name, q]))));
    fill(runningEl, "limits", limited(frame.queues));
  };
  subscribe((change) => {
    if (change.what === "queues" || change.what === "closed") draw();
  });
}
