// The board's websocket, /ws/board/: this module applies its frames (snapshot parts, "tasks",
// "removed", "problems", "insights", "queues", "bulk") and handles its close codes (4403: stop and link to the
// login; 4408, 1011, 1006: grey the cards out and reconnect with a backoff). The frames, the close
// codes and the rules applied here (versions, unseen_event_ids, last_removal_id, gaps) are
// written down once, in docs/live-protocol.md; this page sends only {"type": "snapshot"}.
//
// What a test or a person may read of it (the page's documented state, nothing more): on
// #connection, data-state (connecting, live, reconnecting, ended), data-socket (opening, open,
// waiting: a reconnect is scheduled; none: the page will not connect again) and data-snapshots
// (how many snapshots the page has applied); on <body>, data-ready="true" once the first
// snapshot's cards are on screen (after the frame that follows them).

// It feeds the model (store.js) and nothing else: what the page shows follows from the model's
// changes (render.js, details.js, view.js and insights.js subscribe to it).

import { columnsEl, LOGIN_URL, OFF_WINDOW_MAX } from "./page.js";
import {
  applyMove, applySnapshot, applyTask, knownTask, offWindowSize, removeTask, setBulkJob, setInsights, setProblems, setQueues,
  snapshotCount,
} from "./store.js";

const NOT_ALLOWED = 4403; // board/live/consumers.py NOT_ALLOWED
const BACKOFF_FIRST_MS = 500;
const BACKOFF_MAX_MS = 5000;
// How long an event id skipped over may stay missing before the page takes a fresh snapshot.
// The server has no such window to derive it from: its tailer waits for a missing id however
// long the transaction that took it runs, until it is proven rolled back (board/live/outbox.py,
// Cursor), and then delivers it late or never. So an id still missing after a while is a write
// that rolled back (PostgreSQL hands out ids that never commit), a transaction still open, or a
// frame lost on the way. The snapshot repairs the last and costs one read for the others (an
// event that comes after it is applied by version like any other). 3 s is longer than the
// board's own write transactions take and short enough that a lost change is repaired while
// someone watches.
const MISSING_EVENT_PATIENCE_MS = 3000;

const connectionEl = document.getElementById("connection");
let socket = null;
let backoff = BACKOFF_FIRST_MS;
let reconnectTimer = null;
let sessionEnded = false;
let snapshotRequested = false;
let partialSnapshot = null; // the parts of a snapshot received so far
let readyScheduled = false;

let snapshotEventId = 0; // the last event the current snapshot includes
// Ids at or below it whose events the snapshot does not hold (on PostgreSQL, transactions that
// had taken an id and not committed yet when it was read): every other event up to
// snapshotEventId is in the snapshot.
let unseenAtSnapshot = new Set();
const countedUnseen = new Set(); // those of them whose events came since (counted once)
let snapshotRemovalId = 0; // the last record of a deleted task the current snapshot accounts for
let maxEventId = 0; // the highest event id seen since that snapshot
const missingEvents = new Map(); // event id skipped over -> when it was noticed

function setConnection(state, note) {
  connectionEl.dataset.state = state;
  const label = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", ended: "session ended" }[state];
  connectionEl.textContent = note ? `${label} (${note})` : label;
}

function showSocketState() {
  connectionEl.dataset.socket = socket
    ? (socket.readyState === WebSocket.OPEN ? "open" : "opening")
    : reconnectTimer !== null ? "waiting" : "none";
}

/** The login page, back to this very view afterwards (written as Django's login redirect writes it). */
function loginUrl() {
  const next = encodeURIComponent(location.pathname + location.search).replace(/%2F/gi, "/");
  return `${LOGIN_URL}?next=${next}`;
}

// The session is gone (logged out, expired, deleted, or the user lost the right to watch):
// reconnecting cannot help, so stop, and say what would. The server tells it by closing with
// NOT_ALLOWED after accepting (board/live/consumers.py): a refusal before the handshake would
// reach the page as 1006, like an outage.
function endSession() {
  if (sessionEnded) return;
  sessionEnded = true;
  clearTimeout(reconnectTimer);
  reconnectTimer = null;
  if (socket) {
    const ws = socket;
    socket = null;
    ws.close();
  }
  showSocketState();
  columnsEl.classList.add("stale");
  setConnection("ended");
  const box = document.getElementById("session-ended");
  box.querySelector("a").href = loginUrl();
  box.hidden = false;
}

function connect() {
  reconnectTimer = null;
  if (sessionEnded) return;
  setConnection(snapshotCount() > 0 ? "reconnecting" : "connecting");
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  const ws = new WebSocket(`${scheme}${location.host}/ws/board/`);
  socket = ws;
  showSocketState();
  ws.onopen = () => { if (socket === ws) showSocketState(); };
  ws.onmessage = (e) => {
    if (socket !== ws) return;
    receive(JSON.parse(e.data));
  };
  ws.onclose = (e) => {
    if (socket !== ws) return;
    socket = null;
    snapshotRequested = false;
    partialSnapshot = null;
    if (e.code === NOT_ALLOWED) {
      endSession();
      return;
    }
    // Changes made while away are not shown: the cards are greyed until a fresh snapshot.
    columnsEl.classList.add("stale");
    setConnection("reconnecting");
    const delay = Math.min(backoff, BACKOFF_MAX_MS) * (0.75 + Math.random() * 0.5);
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    reconnectTimer = setTimeout(connect, delay);
    showSocketState();
  };
}

function requestSnapshot() {
  if (snapshotRequested || !socket || socket.readyState !== WebSocket.OPEN) return;
  snapshotRequested = true;
  socket.send(JSON.stringify({ type: "snapshot" }));
}

function receive(message) {
  switch (message.type) {
    case "snapshot":
      partialSnapshot = message.more ? message : null;
      if (!message.more) onSnapshot(message);
      break;
    case "snapshot_more":
      if (!partialSnapshot) break; // its head was sent on a socket since closed
      for (const task of message.tasks) partialSnapshot.tasks.push(task);
      if (!message.more) {
        const snap = partialSnapshot;
        partialSnapshot = null;
        onSnapshot(snap);
      }
      break;
    case "tasks": // oldest first
      for (const item of message.items) applyChange(item.event, item.task);
      break;
    case "removed": // oldest first
      for (const removal of message.tasks) {
        if (removal.id > snapshotRemovalId) removeTask(removal.task, removal.stage);
      }
      break;
    case "problems":
      setProblems(message.problems);
      break;
    case "insights":
      setInsights(message);
      break;
    case "queues":
      setQueues(message);
      break;
    case "bulk": // a bulk job's progress (bulk.js draws the one this page started)
      setBulkJob(message);
      break;
  }
}

function onSnapshot(snap) {
  snapshotRequested = false;
  backoff = BACKOFF_FIRST_MS;
  snapshotEventId = snap.last_event_id || 0;
  unseenAtSnapshot = new Set(snap.unseen_event_ids || []);
  countedUnseen.clear();
  snapshotRemovalId = snap.last_removal_id || 0;
  maxEventId = snapshotEventId;
  missingEvents.clear();
  applySnapshot(snap); // its listeners draw it, and open the task the URL names
  connectionEl.dataset.snapshots = String(snapshotCount());
  setConnection("live");
  columnsEl.classList.remove("stale");
  if (!readyScheduled) {
    // The first snapshot is on screen once the next frame has been drawn.
    readyScheduled = true;
    requestAnimationFrame(() => setTimeout(() => { document.body.dataset.ready = "true"; }, 0));
  }
}

function applyChange(event, task) {
  noteEventId(event.id);
  // The snapshot holds every event up to its last one but those it lists as unseen: on
  // PostgreSQL a transaction takes its event id before it commits, so a change committed after
  // the snapshot was read can have a lower id (board/live/outbox.py), and the page applies it.
  // A later event's move is counted once: the columns' counts are the snapshot's plus these.
  const after = event.id > snapshotEventId || unseenAtSnapshot.has(event.id);
  if (after && !countedUnseen.has(event.id)) {
    if (event.id <= snapshotEventId) countedUnseen.add(event.id);
    applyMove(event);
  }
  if (!task) return; // deleted since (a "removed" frame says so)
  const known = knownTask(task.id);
  // A change the snapshot already holds, to a task it left out (one past its column's first
  // page, or one deleted since): nothing to show. Such a frame was built before the snapshot was
  // read and reached the page after it; its task may be an older state (a RUNNING card that has
  // finished since).
  if (!known && !after) return;
  if (known && event.version > known.version + 1) requestSnapshot(); // a lost frame
  applyTask(task);
  // Too many changes kept for tasks no column shows: a snapshot starts the page over with none.
  if (offWindowSize() > OFF_WINDOW_MAX) requestSnapshot();
}

// Event ids arrive in increasing order, but for late commits (see MISSING_EVENT_PATIENCE_MS).
function noteEventId(id) {
  if (id > maxEventId) {
    for (let missing = maxEventId + 1; missing < id && missingEvents.size < 10000; missing++) {
      missingEvents.set(missing, performance.now());
    }
    maxEventId = id;
  } else {
    missingEvents.delete(id);
  }
}

function checkMissingEvents() {
  const now = performance.now();
  for (const [id, at] of missingEvents) {
    if (now - at > MISSING_EVENT_PATIENCE_MS) {
      missingEvents.clear();
      requestSnapshot();
      return;
    }
  }
}

/** Watch for event ids that stay missing, and open the socket. */
export function startSocket() {
  setInterval(checkMissingEvents, 1000);
  connect();
}
