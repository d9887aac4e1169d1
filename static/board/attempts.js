// The attempt timeline of the details panel: one entry per attempt (each claim or resume takes
// a new lease, with a new fence), built from the task's history as GET /api/tasks/<id>/events
// gives it (oldest first). Who held it, from when to when, its heartbeats (renews) as a count,
// and how it ended, with that failure's own error and traceback (kept in its history row).
// details.js calls renderAttempts(events, task) with the history it loaded.

import { el } from "./page.js";

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
  cancel: "cancelled",
};

function duration(ms) {
  if (!(ms >= 0)) return "";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** The attempts of a history (events oldest first), as plain objects for rendering. */
function attemptsOf(events, task) {
  const attempts = [];
  let current = null;
  for (const e of events) {
    const detail = e.detail && typeof e.detail === "object" ? e.detail : {};
    if (e.verb === "claim" || e.verb === "resume") {
      current = {
        number: attempts.length + 1, verb: e.verb, agent: e.actor, fence: e.fence, from: e.at,
        to: null, heartbeats: 0, lastHeartbeat: null, outcome: "running", error: "", traceback: "",
        by: "", note: "",
      };
      attempts.push(current);
      continue;
    }
    if (!current) continue; // before the first claim: creation, admission, edits
    if (e.verb === "renew" && e.fence === current.fence) {
      current.heartbeats += 1;
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
  return attempts;
}

export function renderAttempts(events, task) {
  const attempts = attemptsOf(events || [], task);
  const section = el("section", "attempts");
  section.setAttribute("aria-label", "Attempts");
  section.append(el("h3", null, `Attempts (${attempts.length})`));
  if (!attempts.length) {
    section.append(el("p", "attempt-meta", "Not claimed yet."));
    return section;
  }
  const list = el("ol");
  for (const a of attempts) {
    const li = el("li", "attempt");
    li.dataset.outcome = a.outcome;
    li.dataset.fence = String(a.fence);
    li.append(el("div", "attempt-head", `#${a.number} · ${a.agent || "?"}${a.verb === "resume" ? " (resumed)" : ""} · fence ${a.fence}`));
    const from = new Date(a.from);
    const to = a.to ? new Date(a.to) : null;
    const span = to ? `${from.toLocaleString()} → ${to.toLocaleTimeString()} (${duration(to - from)})`
      : `since ${from.toLocaleString()}`;
    const beats = a.heartbeats === 1 ? "1 heartbeat" : `${a.heartbeats} heartbeats`;
    li.append(el("div", "attempt-meta", `${span} · ${beats}`));
    const outcome = el("div", "attempt-outcome");
    const label = el("strong", "attempt-label", a.outcome === "running" ? "running" : a.outcome);
    outcome.append(label);
    if (a.by) outcome.append(` by ${a.by}`);
    if (a.note) outcome.append(` · ${a.note}`);
    li.append(outcome);
    if (a.error) li.append(el("pre", "attempt-error", a.error));
    if (a.traceback) {
      const more = el("details", "attempt-traceback");
      more.append(el("summary", null, "traceback"), el("pre", null, a.traceback));
      li.append(more);
    }
    list.append(li);
  }
  section.append(list);
  return section;
}
