// A task's fields as a <dl>, for the details panel (details.js) and the task's own page
// (taskpage.js): one renderer. The attempts and the errors are not here: the attempt timeline
// (attempts.js) counts the attempts once and shows each failure's error once.

import { el, prefersText, requiresText, resourcesText, taskPageUrl } from "./page.js";

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

/** "waiting for": why its resources keep a QUEUED task waiting (store.js resourceWait), and the
 * tasks that hold them, each a link to its page. */
function waitField(dl, wait) {
  dl.append(el("dt", null, "waiting for"));
  const dd = el("dd", "resource-wait", wait.why);
  if (wait.holders.length) {
    const list = el("ul", "resource-holders");
    for (const h of wait.holders) {
      const li = el("li", null, `${h.node}: `);
      const link = el("a", null, h.task);
      link.href = taskPageUrl(h.task);
      li.append(link, ` (${h.agent || "—"})`);
      list.append(li);
    }
    dd.append(list);
  }
  dl.append(dd);
}

/** "requires": the capabilities its claimer must hold (issue 32, item 3); while QUEUED with
 * `unclaimable` (check()'s words: no agent key used in the last hour holds them all), said plainly
 * after them, as on its card. */
function requiresField(dl, task, unclaimable) {
  dl.append(el("dt", null, "requires"));
  const dd = el("dd", "requires", requiresText(task.requires));
  if (unclaimable && task.stage === "QUEUED") {
    const them = task.requires.length === 1 ? "it" : "them";
    const b = el("span", "badge waiting unclaimable", `no agent with ${them} seen in the last hour`);
    b.title = unclaimable;
    dd.append(" ", b);
  }
  dl.append(dd);
}

/** The fields of `task` (as store.js prepares it: createdMs, inStageSinceMs, ...); `deps`: the
 * dependencies as text, or null to leave them out (the task page lists them both ways);
 * `resourceWait`: what holds its resources when it waits for them (the board's, store.js);
 * `unclaimable`: check()'s unclaimable_requirements text for it, if any. */
export function taskFields(task, deps, resourceWait = undefined, unclaimable = undefined) {
  const dl = el("dl");
  field(dl, "stage", `${task.stage} (version ${task.version}) since ${new Date(task.inStageSinceMs).toLocaleString()}`);
  field(dl, "owner", task.owner || "—");
  field(dl, "queue / priority", `${task.queue} / ${task.priority}`);
  // The claim order (board/engine/fairness.py): claims take the lowest rank first. As a time, it
  // is when the task's wait counts from, moved earlier by its priority (a minute a level) and
  // later by its fairness key's turns.
  field(dl, "place in line", `${new Date(task.claim_rank * 1000).toLocaleString()}` +
    (task.fairness_key ? ` (fairness key ${task.fairness_key})` : ""));
  if (task.tags && task.tags.length) field(dl, "tags", task.tags.join(", "));
  if (task.replay_of) {
    // Run again as new from a finished task: a link to it.
    dl.append(el("dt", null, "run again from"));
    const dd = el("dd");
    const link = el("a", "replay-of", task.replay_of);
    link.href = `/board/task/${encodeURIComponent(task.replay_of)}`;
    dd.append(link);
    dl.append(dd);
  }
  field(dl, "fence", String(task.fence));
  if (task.lease_expires_at) field(dl, "lease until", new Date(task.leaseExpiresMs).toLocaleString());
  if (task.not_before) field(dl, "not before", new Date(task.not_before).toLocaleString());
  if (deps !== null) field(dl, "dependencies", deps);
  if (task.resources && task.resources.length) {
    field(dl, "resources", `${resourcesText(task.resources)}${task.stage === "RUNNING" ? ": held" : ""}`);
  }
  if (resourceWait) waitField(dl, resourceWait);
  // Capabilities (issue 32, item 3), fixed at creation: what a claimer must hold, and what it is
  // preferred for (each label's weight: priority levels, for a claimer holding it).
  if (task.requires && task.requires.length) requiresField(dl, task, unclaimable);
  if (task.prefers && Object.keys(task.prefers).length) field(dl, "prefers", prefersText(task.prefers));
  field(dl, "description", task.description || "—", true);
  field(dl, "payload", json(task.payload), true);
  field(dl, "checkpoint", json(task.checkpoint), true);
  field(dl, "progress", task.progress === null || task.progress === undefined ? "—" : `${Math.round(task.progress * 100)}%`);
  if (task.result !== null && task.result !== undefined) field(dl, "result", json(task.result), true);
  field(dl, "created / updated", `${new Date(task.createdMs).toLocaleString()} / ${new Date(task.updatedMs).toLocaleString()}`);
  return dl;
}
