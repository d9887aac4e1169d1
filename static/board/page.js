// What the page (templates/board/board.html, rendered by board/live/views.py) hands the board's
// modules, read once: the columns and stages, the lifecycle's moves, whether this user may act,
// where the login and the admin are. Plus the few DOM helpers every module uses, and the
// per-frame batching of redraws.
//
// Imports nothing: every other module of the board may import it.

/** stage -> its column element, in the order the page lists them (the lifecycle's). */
export const COLUMN_ELS = new Map([...document.querySelectorAll("#columns .column")].map((c) => [c.dataset.stage, c]));
/** Every legal move of the lifecycle as [from stage, verb, to stage] (board.engine.lifecycle.TRANSITIONS). */
export const MOVES = JSON.parse(document.getElementById("moves").textContent);
// A page without columns (a task's own page, templates/board/task.html) still knows the stages:
// the lifecycle's moves name them all.
export const STAGES = COLUMN_ELS.size ? [...COLUMN_ELS.keys()] : [...new Set(MOVES.flatMap(([from, , to]) => [from, to]))];
/** Terminal stages are those no move leaves (COMPLETED, CANCELLED): the snapshot carries only
 * their most recent tasks, and their columns list the most recent first. */
export const TERMINAL = new Set(STAGES.filter((s) => !MOVES.some(([from]) => from === s)));
export const CAN_INTERVENE = document.body.dataset.canIntervene === "true";
/** board.change_queue (board/access.py may_change_queues): the queues strip offers Pause/Resume. */
export const CAN_CHANGE_QUEUES = document.body.dataset.canChangeQueues === "true";
export const LOGIN_URL = document.body.dataset.loginUrl;
// How many changed tasks the page keeps below its columns' windows before it takes a fresh
// snapshot instead (TASKFLOW_BOARD_OFF_WINDOW_MAX; socket.js).
export const OFF_WINDOW_MAX = Number(document.body.dataset.offWindowMax) || 10000;
// Who this user is as an approver (board.access.approver: username, group names,
// board.intervene, superuser), or null on a page that does not say.
const APPROVER_EL = document.getElementById("approver");
const APPROVER = APPROVER_EL ? JSON.parse(APPROVER_EL.textContent) : null;

/** Whether this user may answer `approval` ({approvers}): a port of the engine's rule
 * (board.engine.approvals.may_answer) for the page's buttons; the server judges again (403).
 * True when the page does not say who the user is. */
export function mayAnswer(approval) {
  if (!APPROVER || APPROVER.superuser) return true;
  const named = approval.approvers || [];
  if (named.length) return named.includes(APPROVER.username) || APPROVER.groups.some((g) => named.includes(g));
  return APPROVER.operator;
}
const ADMIN_URL = document.body.dataset.adminUrl;

export const columnsEl = document.getElementById("columns");

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}

/** An element's text set in place: its one Text node's data changed (textContent would replace
 *  the node, and a label ticking every second on every card left the browser that many nodes
 *  and their layout objects to collect). */
export function setText(element, text) {
  const node = element.firstChild;
  if (node && node.nodeType === Node.TEXT_NODE && !node.nextSibling) {
    if (node.data !== text) node.data = text;
  } else {
    element.textContent = text;
  }
}

let messageTimer = null;

/** A note in the top bar (an action's outcome, a failed load), hidden after a while. */
export function showMessage(text, kind = "info") {
  const box = document.getElementById("message");
  box.textContent = text;
  box.dataset.kind = kind;
  box.hidden = false;
  clearTimeout(messageTimer);
  messageTimer = setTimeout(() => { box.hidden = true; }, kind === "error" ? 15000 : 6000);
}

/** A queue's rate as the board writes it: "rate 60/min", "rate 2/s", "rate 5 per 90 s". */
export function rateText(rate) {
  const per = { 1: "s", 60: "min", 3600: "h" }[rate.per_seconds];
  return per ? `rate ${rate.count}/${per}` : `rate ${rate.count} per ${rate.per_seconds} s`;
}

/** The admin's change page of a task: its id quoted as django.contrib.admin.utils.quote does. */
export function adminUrl(id) {
  const quoted = id.replace(/[":/_#?;@&=+$,[\]<>%\n\\]/g, (c) => `_${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, "0")}`);
  return `${ADMIN_URL}board/task/${encodeURIComponent(quoted)}/change/`;
}

/** The task's own page (board/live/views.py task_page). */
export function taskPageUrl(id) {
  return `/board/task/${encodeURIComponent(id)}`;
}

/** A redraw batched per animation frame: the function returned asks for one `draw()` on the
 * next frame, or within 300 ms in a background tab (which gets no frames: the DOM is still
 * kept current); asking again before it ran changes nothing. */
export function frameBatcher(draw) {
  let requested = false;
  const run = () => {
    if (!requested) return;
    requested = false;
    draw();
  };
  return () => {
    if (requested) return;
    requested = true;
    requestAnimationFrame(run);
    setTimeout(run, 300);
  };
}

/** Open `dialog` (a <dialog> whose form has a reason textarea and a "confirm" button): resolves
 * to {reason} when confirmed, null when dismissed. */
export function askReason(dialog) {
  const reason = dialog.querySelector("textarea");
  reason.value = "";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "confirm" ? { reason: reason.value.trim() } : null);
    }, { once: true });
    dialog.showModal();
    reason.focus();
  });
}

// Resource names (board/engine/resources.py, issue 32): `/` separates levels and the first `:`
// ends a scheme; a name with a wildcard holds the directory before its first wildcard. A port
// of its node_of and ancestors, for the cards that say which resource they wait for.
const WILDCARDS = "*?[";

/** The node a resource name holds: itself, or for a pattern the directory before its first
 * wildcard ("file:src/app/**" -> "file:src/app/", "branch:feat-*" -> "branch:"). */
export function nodeOf(name) {
  const cuts = [...WILDCARDS].map((c) => name.indexOf(c)).filter((i) => i >= 0);
  if (!cuts.length) return name;
  const head = name.slice(0, Math.min(...cuts));
  const colon = head.indexOf(":");
  return head.slice(0, Math.max(head.lastIndexOf("/") + 1, colon >= 0 ? colon + 1 : 0));
}

/** The nodes above `node`, top first: its scheme ("file:") and each directory ("file:src/"). */
export function ancestorsOf(node) {
  const found = [];
  const colon = node.indexOf(":");
  if (colon >= 0 && colon + 1 < node.length) found.push(node.slice(0, colon + 1));
  let start = colon + 1;
  for (;;) {
    const slash = node.indexOf("/", start);
    if (slash < 0 || slash + 1 >= node.length) break;
    found.push(node.slice(0, slash + 1));
    start = slash + 1;
  }
  return found;
}

/** A task's declared resources as [{name, node, units}] (units null: exclusive), by node. */
export function resourceNeeds(resources) {
  const needs = (resources || []).map((r) => (typeof r === "string" ? { name: r, node: nodeOf(r), units: null }
    : { name: r.name, node: nodeOf(r.name), units: r.units }));
  return needs.sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
}

/** "merge-slot (exclusive), gpu (2 units)": what a task declares. */
export function resourcesText(resources) {
  return (resources || []).map((r) => (typeof r === "string" ? `${r} (exclusive)`
    : `${r.name} (${r.units} unit${r.units === 1 ? "" : "s"})`)).join(", ");
}

/** "gpu, python": the capabilities a task requires (board/engine/capabilities.py), "" for none. */
export function requiresText(requires) {
  return (requires || []).join(", ");
}

/** "model:opus (weight 3), fast (weight 1)": the capabilities a task prefers, "" for none. */
export function prefersText(prefers) {
  return Object.entries(prefers || {}).map(([label, weight]) => `${label} (weight ${weight})`).join(", ");
}
