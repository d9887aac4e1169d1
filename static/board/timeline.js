// A task's history as the details panel (details.js) and the task's own page (taskpage.js) list
// it, from GET /api/tasks/<id>/events (oldest first). One renderer for both:
//   - a run of heartbeats (renews of one lease) is one row, "renewed 8 times, 05:21:03–05:21:28",
//     not one row each (a long task renews thousands of times);
//   - a move's reason and error are shown as text (the reason quoted, the error's first line:
//     the attempt timeline shows the whole error and folds its traceback, once), the rest of its
//     detail as compact JSON;
//   - operators' moves name who made them.
// The admin's history page groups renews the same way on the server (board/admin/history.py).

import { el } from "./page.js";

/** The verbs an operator makes (board.engine.transitions.operators), shown with their reason. */
const OPERATOR_VERBS = new Set(["admit", "requeue", "cancel", "force_release", "force_pause", "edit",
  "answer"]);  // a person's answer to an approval: between two attempts, as an operator's move

const VERB_WORDS = {
  requeue: "requeued", cancel: "cancelled", admit: "admitted", force_release: "released",
  force_pause: "paused", edit: "edited", answer: "answered",
};

/** Whether history row `e` is an operator's move (not the engine's own admission, by "system"). */
export function isOperatorMove(e) {
  return OPERATOR_VERBS.has(e.verb) && e.actor !== "system";
}

/** What an operator's move did, in words: "requeued by ops-1". */
export function operatorWords(verb, actor) {
  return `${VERB_WORDS[verb] || verb}${actor ? ` by ${actor}` : ""}`;
}

/** A time as the page shows it, seconds included. */
export function timeText(at) {
  return new Date(at).toLocaleString();
}

function clockText(at) {
  return new Date(at).toLocaleTimeString();
}

/** The history with each run of renews of one lease (same fence, nothing else between) made
 * one entry {verb: "renew", count, from, to, fence, actor, first, last}; other events as they are. */
export function collapseRenewals(events) {
  const out = [];
  for (const e of events || []) {
    const last = out[out.length - 1];
    if (e.verb === "renew" && last && last.renewals && last.fence === e.fence) {
      last.count += 1;
      last.to = e.at;
      last.last = e;
      continue;
    }
    if (e.verb === "renew") {
      out.push({ renewals: true, verb: "renew", count: 1, from: e.at, to: e.at, fence: e.fence, actor: e.actor, first: e, last: e });
      continue;
    }
    out.push(e);
  }
  return out;
}

/** "renewed 8 times, 05:21:03–05:21:28" (one renew: "renewed once at 05:21:03"). */
export function renewalsText(run) {
  if (run.count === 1) return `renewed once at ${clockText(run.from)}`;
  return `renewed ${run.count} times, ${clockText(run.from)}–${clockText(run.to)}`;
}

/** An error shown once: its first line, the rest (or the traceback, which holds it) folded.
 * `cls`, `foldedCls`: the classes of the first line's <pre> and of the fold. */
export function errorNodes(error, traceback, cls = "error-head", foldedCls = "error-more") {
  const nodes = [];
  const text = String(error || "");
  const [head, ...rest] = text.split("\n");
  if (head) nodes.push(el("pre", cls, head));
  const folded = traceback || rest.join("\n").trim();
  if (folded) {
    const more = el("details", foldedCls);
    more.append(el("summary", null, traceback ? "traceback" : "more"), el("pre", null, folded));
    nodes.push(more);
  }
  return nodes;
}

/** The detail of a history row as nodes: its reason, its error, the rest as compact JSON. */
function detailNodes(detail) {
  if (detail === null || detail === undefined) return [];
  if (typeof detail !== "object" || Array.isArray(detail)) return [el("pre", "detail", JSON.stringify(detail))];
  const { reason, error, traceback, ...rest } = detail;
  const nodes = [];
  if (reason) nodes.push(el("q", "reason", reason));
  // The error's first line only: its whole text and traceback are shown once, folded, in the
  // attempt timeline beside this list (attempts.js).
  if (error) nodes.push(el("pre", "error-head", String(error).split("\n")[0]));
  if (traceback) nodes.push(el("span", "error-more-note", "traceback: in the attempt timeline"));
  if (Object.keys(rest).length) nodes.push(el("pre", "detail", JSON.stringify(rest)));
  return nodes;
}

/** One <li> per history row, renews collapsed (oldest first, as the events come). */
export function historyItems(events) {
  return collapseRenewals(events).map((e) => {
    const li = el("li", "history-item");
    li.dataset.verb = e.verb;
    if (e.renewals) {
      li.classList.add("history-renewals");
      li.dataset.count = String(e.count);
      li.append(el("time", null, timeText(e.from)), " ", el("strong", null, renewalsText(e)),
        ` · fence ${e.fence}${e.actor ? ` · ${e.actor}` : ""}`);
      return li;
    }
    if (isOperatorMove(e)) li.classList.add("history-operator");
    li.append(
      el("time", null, timeText(e.at)), " ",
      el("strong", null, e.verb), ` ${e.from_stage || "∅"} → ${e.to_stage} · v${e.version} · fence ${e.fence}`,
      e.actor ? ` · ${e.actor}` : "",
    );
    const nodes = detailNodes(e.detail);
    if (nodes.length) {
      const box = el("div", "history-detail");
      box.append(...nodes);
      li.append(box);
    }
    return li;
  });
}
