// The attempt timeline of the details panel: one entry per attempt (each claim or resume takes
// a new lease, with a new fence), built from the task's history as GET /api/tasks/<id>/events
// gives it (oldest first). Who held it, from when to when, its heartbeats (renews) as a count,
// and how it ended, with that failure's own error and traceback (kept in its history row), the
// error shown once (its first line; the traceback folded). Operators' moves between attempts
// (a requeue, an admit, a cancel, an edit) are entries of the timeline too, with who made them
// and their reason. Notes on the task (GET /api/tasks/<id>/notes: its holders' and staff's) sit in
// the attempt whose lease they were written under (same fence, before it ended), else in the
// timeline at their time. Usage reports (GET /api/tasks/<id>/usage) are summed per attempt (by
// fence) and in all; a missing cost is said as missing, never as $0. details.js and taskpage.js
// call renderAttempts(events, task, notes, usage) with what they loaded.

import { el } from "./page.js";
import { errorNodes, isOperatorMove, operatorWords } from "./timeline.js";

const STYLE = `
.attempts { margin: 8px 0; }
.attempts h3 { margin: 0 0 4px; }
.attempts ol { list-style: none; margin: 0; padding: 0; }
.attempt { border-left: 4px solid var(--line, #d9dce1); padding: 4px 8px; margin: 0 0 6px; }
.attempt[data-outcome="completed"] { border-left-color: var(--ok, #2e7d32); }
.attempt[data-outcome="failed"], .attempt[data-outcome="expired"] { border-left-color: var(--bad, #c62828); }
.attempt[data-outcome="running"] { border-left-color: var(--accent, #1565c0); }
.attempt .attempt-head { font-weight: 600; }
.attempt .attempt-meta { color: var(--muted, #6b7280); font-size: 12px; }
.attempt .attempt-outcome { margin-top: 2px; }
.attempt .attempt-error { white-space: pre-wrap; overflow-wrap: anywhere; margin: 2px 0; font-size: 12px; }
.attempt details pre { max-height: 240px; overflow: auto; font-size: 11px; margin: 2px 0; }
.attempts .attempt-budget { color: var(--muted, #6b7280); font-size: 12px; margin: 0 0 4px; }
.attempts .operator-move { border-left: 4px dashed var(--todo, #a33a00); padding: 2px 8px; margin: 0 0 6px; font-size: 12px; }
.attempts .operator-move q { display: block; }
.attempts .note { border-left: 4px dotted var(--muted, #6b7280); padding: 2px 8px; margin: 2px 0 6px; font-size: 12px; }
.attempt .note { border-left: none; padding: 0; margin: 4px 0 0; }
.note .note-text { display: block; white-space: pre-wrap; overflow-wrap: anywhere; font-size: 13px; }
.note .note-meta { color: var(--muted, #6b7280); }
.attempt-usage { color: var(--muted, #6b7280); font-size: 12px; margin: 2px 0; }
`;
const style = document.createElement("style");
style.textContent = STYLE;
document.head.append(style);

// How an attempt ended, by the verb of the event that ended it.
const ENDINGS = {
  complete: "completed",
  fail: "failed",
  reclaim: "expired",
  release: "released",
  force_release: "released",
  pause: "paused",
  force_pause: "paused",
  ask: "asked a person",  // an approval gate: the lease is given up until the answer
  cancel: "cancelled",
};

function duration(ms) {
  if (!(ms >= 0)) return "";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** The attempts of a history (events oldest first), as plain objects for rendering, and the
 * timeline: the attempts and the operators' moves that did not end one, in order. */
function attemptsOf(events, task) {
  const attempts = [];
  const timeline = [];
  let current = null;
  for (const e of events) {
    const detail = e.detail && typeof e.detail === "object" ? e.detail : {};
    const endsAttempt = current && current.to === null && e.from_stage === "RUNNING" && ENDINGS[e.verb];
    if (isOperatorMove(e) && !endsAttempt) {
      // A requeue, an admit, a cancel of a task not running, an edit: between attempts.
      timeline.push({ move: true, verb: e.verb, actor: e.actor, at: e.at, reason: detail.reason || "",
        reset: !!detail.reset_attempts, changed: detail.changed || [] });
      continue;
    }
    if (e.verb === "claim" || e.verb === "resume") {
      current = {
        number: attempts.length + 1, verb: e.verb, agent: e.actor, fence: e.fence, from: e.at,
        to: null, heartbeats: 0, firstHeartbeat: null, lastHeartbeat: null, outcome: "running", error: "", traceback: "",
        by: "", note: "",
      };
      attempts.push(current);
      timeline.push(current);
      continue;
    }
    if (!current) continue; // before the first claim: creation, admission, edits
    if (e.verb === "renew" && e.fence === current.fence) {
      current.heartbeats += 1;
      if (!current.firstHeartbeat) current.firstHeartbeat = e.at;
      current.lastHeartbeat = e.at;
      continue;
    }
    if (e.verb === "retry" && current.outcome === "failed") {
      if (detail.backoff_seconds !== undefined) current.note = `retried after a ${detail.backoff_seconds} s backoff`;
      continue;
    }
    const ending = ENDINGS[e.verb];
    if (!ending || current.to !== null || e.from_stage !== "RUNNING") continue;
    current.to = e.at;
    current.outcome = detail.reason === "lease expired" ? "expired" : ending;
    current.error = detail.error || (ending === "failed" ? "" : detail.reason || "");
    current.traceback = detail.traceback || "";
    if (e.actor && e.actor !== current.agent) current.by = e.actor;
    if (current.outcome === "expired" && !current.error) current.error = "lease expired";
  }
  // The task's own last error stands in for a failure recorded before errors were kept per
  // failure (older history rows have none).
  const lastFailed = [...attempts].reverse().find((a) => a.outcome === "failed");
  if (lastFailed && !lastFailed.error && task && task.error) lastFailed.error = task.error;
  return { attempts, timeline };
}

function moveItem(m) {
  const li = el("li", "operator-move");
  li.dataset.verb = m.verb;
  const what = operatorWords(m.verb, m.actor);
  li.append(el("strong", null, what), ` · ${new Date(m.at).toLocaleString()}`);
  if (m.reset) li.append(" · attempts reset");
  if (m.changed.length) li.append(` · ${m.changed.join(", ")}`);
  if (m.reason) li.append(el("q", "reason", m.reason));
  return li;
}

/** Put each note in the attempt it was written in (same fence, not after the attempt ended),
 * or, when none, in the timeline at its time. */
function placeNotes(timeline, attempts, notes) {
  for (const a of attempts) a.notes = [];
  const loose = [];
  for (const n of notes || []) {
    const home = attempts.find((a) => a.fence === n.fence && (a.to === null || new Date(n.at) <= new Date(a.to)));
    if (home) home.notes.push(n);
    else loose.push({ looseNote: true, at: n.at, note: n });
  }
  const when = (item) => new Date(item.looseNote || item.move ? item.at : item.from).getTime();
  return loose.length ? [...timeline, ...loose].sort((x, y) => when(x) - when(y)) : timeline;
}

function noteItem(n, tag = "li") {
  const item = el(tag, "note");
  item.append(el("span", "note-meta", `note by ${n.author}${n.by_holder ? " (holder)" : ""} · ${new Date(n.at).toLocaleString()}`),
    el("span", "note-text", n.text));
  return item;
}

/** "1,200 in + 300 out tokens · $0.05 (opus)", or "… · cost not reported (1 of 2 reports)". */
function usageText(u, models = []) {
  const tokens = `${u.input_tokens.toLocaleString()} in + ${u.output_tokens.toLocaleString()} out tokens`;
  const cost = u.cost_usd !== null ? ` · $${u.cost_usd.toFixed(u.cost_usd < 1 ? 4 : 2)}`
    : ` · cost not reported (${u.cost_missing} of ${u.reports} report${u.reports === 1 ? "" : "s"})`;
  return `used ${tokens}${cost}${models.length ? ` (${models.join(", ")})` : ""}`;
}

export function renderAttempts(events, task, notes = [], usage = null) {
  const parts = attemptsOf(events || [], task);
  const attempts = parts.attempts;
  const timeline = placeNotes(parts.timeline, attempts, notes);
  const section = el("section", "attempts");
  section.setAttribute("aria-label", "Attempts");
  section.append(el("h3", null, `Attempts (${attempts.length})`));
  if (usage && usage.total.reports) section.append(el("p", "attempt-usage usage-total", `In all: ${usageText(usage.total)}`));
  const usageOf = new Map(((usage && usage.attempts) || []).map((u) => [u.fence, u]));
  // One count: the heading's. What the retry limit counts differs when an operator reset it
  // (a requeue with reset) or a release gave an attempt back; said as such, not as a second
  // "attempts N of M" beside the heading.
  if (task && task.max_retries !== undefined) {
    const left = Math.max(0, task.max_retries + 1 - task.attempts);
    let budget = "";
    if (task.attempts !== attempts.length) {
      budget = `${task.attempts} counted against max retries ${task.max_retries}` +
        (timeline.some((m) => m.move && m.reset) ? " (an operator reset the count)" : "") + `; ${left} more allowed`;
    } else {
      budget = `${left} more allowed (max retries ${task.max_retries})`;
    }
    // A finished task runs no more: its retry limit is no longer news.
    if (budget && task.stage !== "COMPLETED" && task.stage !== "CANCELLED") section.append(el("p", "attempt-budget", budget));
  }
  if (!timeline.length) {
    section.append(el("p", "attempt-meta", "Not claimed yet."));
    return section;
  }
  const list = el("ol");
  for (const a of timeline) {
    if (a.move) {
      list.append(moveItem(a));
      continue;
    }
    if (a.looseNote) {
      list.append(noteItem(a.note));
      continue;
    }
    const li = el("li", "attempt");
    li.dataset.outcome = a.outcome;
    li.dataset.fence = String(a.fence);
    li.append(el("div", "attempt-head", `#${a.number} · ${a.agent || "?"}${a.verb === "resume" ? " (resumed)" : ""} · fence ${a.fence}`));
    const from = new Date(a.from);
    const to = a.to ? new Date(a.to) : null;
    const span = to ? `${from.toLocaleString()} → ${to.toLocaleTimeString()} (${duration(to - from)})`
      : `since ${from.toLocaleString()}`;
    // Heartbeats as a counted range, never one line each.
    const beats = `${a.heartbeats === 1 ? "1 heartbeat" : `${a.heartbeats} heartbeats`}` +
      (a.heartbeats > 1 ? ` (${new Date(a.firstHeartbeat).toLocaleTimeString()}–${new Date(a.lastHeartbeat).toLocaleTimeString()})` : "");
    li.append(el("div", "attempt-meta", `${span} · ${beats}`));
    const outcome = el("div", "attempt-outcome");
    const label = el("strong", "attempt-label", a.outcome === "running" ? "running" : a.outcome);
    outcome.append(label);
    if (a.by) outcome.append(` by ${a.by}`);
    if (a.note) outcome.append(` · ${a.note}`);
    li.append(outcome);
    li.append(...errorNodes(a.error, a.traceback, "attempt-error", "attempt-traceback"));
    const used = usageOf.get(a.fence);
    if (used) li.append(el("div", "attempt-usage", usageText(used, used.models)));
    for (const n of a.notes) li.append(noteItem(n, "div"));
    list.append(li);
  }
  section.append(list);
  return section;
}
