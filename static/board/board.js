// The live board's client: plain JavaScript, no build step.
//
// Data: the websocket /ws/board/ sends a snapshot on connect (and on request), then one
// {"type": "task"} message per committed transition and {"type": "problems"} when the problems
// change. The page keeps a map id -> task and applies a task only when its version is newer
// than the one shown. A missing version (a gap), or an event id that never arrives, means a
// message was lost: the page asks for a fresh snapshot. Every reconnect starts from the
// snapshot the server sends on connect.
//
// A socket closed with 4403 means the session is gone: the page stops and links to the login.
// The view (filters, stage, open task) lives in the URL: a link opens the same view.
//
// Rendering: the snapshot builds every column once (DocumentFragment); an event re-renders only
// its card (and the cards that depend on it), batched per animation frame.
//
// Human actions (admit, cancel, requeue/retry, pause, release) POST to the API with the
// session cookie, the CSRF token and the version the card shows, so a move that lost a race is
// refused (409) and the card goes back to where the server says it is.
(() => {
  "use strict";

  // ------------------------------------------------------------------------------------------
  // Constants read from the page

  const COLUMN_ELS = new Map([...document.querySelectorAll("#columns .column")].map((c) => [c.dataset.stage, c]));
  const STAGES = [...COLUMN_ELS.keys()];
  const MOVES = JSON.parse(document.getElementById("moves").textContent); // [from, verb, to]
  // Terminal stages are those no move leaves (COMPLETED, CANCELLED): the snapshot carries only
  // their most recent tasks, and their columns list the most recent first.
  const TERMINAL = new Set(STAGES.filter((s) => !MOVES.some(([from]) => from === s)));
  const CAN_INTERVENE = document.body.dataset.canIntervene === "true";
  const SHOW_MORE_PAGE = 200;
  const MISSING_EVENT_PATIENCE_MS = 3000; // an event id skipped for this long was lost
  const BACKOFF_FIRST_MS = 500;
  const BACKOFF_MAX_MS = 5000;
  const NOT_ALLOWED = 4403; // the socket's close code for a session that may not watch (any more)
  const LOGIN_URL = document.body.dataset.loginUrl;
  const ADMIN_URL = document.body.dataset.adminUrl;

  // The operator's verbs and their endpoints. FAILED -> QUEUED is offered as "retry": a requeue
  // that also gives the task its attempts back (a FAILED task usually has none left).
  const HUMAN_VERBS = {
    admit: { path: "admit", label: "Admit" },
    requeue: { path: "requeue", label: "Requeue" },
    force_release: { path: "force-release", label: "Release" },
    force_pause: { path: "force-pause", label: "Pause" },
    cancel: { path: "cancel", label: "Cancel" },
  };

  /** The human actions the lifecycle allows from `stage`: [{verb, to, path, label, extra}]. */
  function actionsFor(stage) {
    if (!CAN_INTERVENE) return [];
    const out = [];
    for (const [from, verb, to] of MOVES) {
      if (from !== stage || !HUMAN_VERBS[verb]) continue;
      const action = { verb, to, ...HUMAN_VERBS[verb], extra: {} };
      if (verb === "requeue" && stage === "FAILED") {
        action.label = "Retry";
        action.extra = { reset_attempts: true };
      }
      out.push(action);
    }
    return out;
  }

  const ACTIONS = new Map(STAGES.map((s) => [s, actionsFor(s)]));

  // ------------------------------------------------------------------------------------------
  // State

  const tasks = new Map(); // id -> task (as the server sent it, plus parsed times _c, _u, _l)
  const cards = new Map(); // id -> card element (only for tasks on the board)
  const dependents = new Map(); // dependency id -> Set of ids of tasks that wait for it
  const order = new Map(STAGES.map((s) => [s, []])); // stage -> ids in display order
  const olderTerminal = new Map(); // terminal tasks loaded by "show more" (kept over snapshots)
  const showMoreCursor = new Map(); // stage -> API cursor, or null when everything was loaded
  const depInfo = new Map(); // id -> {stage} for dependencies not on the board (fetched)
  let counts = Object.fromEntries(STAGES.map((s) => [s, 0]));
  let problems = [];
  let snapshotEventId = 0; // the last event the current snapshot includes
  let maxEventId = 0; // the highest event id seen since that snapshot
  const missingEvents = new Map(); // event id skipped over -> when we noticed
  let snapshotRequested = false;
  let everLive = false;
  let detailsId = null;
  let highlighted = null;

  // ------------------------------------------------------------------------------------------
  // Small helpers

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  function parseTime(value) {
    if (!value) return null;
    const t = Date.parse(value);
    return Number.isNaN(t) ? null : t;
  }

  function prepare(task) {
    task._c = parseTime(task.created_at) || 0;
    task._u = parseTime(task.updated_at) || 0;
    task._l = parseTime(task.lease_expires_at);
    task._s = parseTime(task.stage_changed_at) || task._u; // when it entered its stage
    return task;
  }

  // Display order: live stages as the server lists them (priority, then age, then id); terminal
  // stages most recent first.
  function compare(a, b) {
    if (TERMINAL.has(a.stage)) {
      if (a._u !== b._u) return b._u - a._u;
      return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
    }
    if (a.priority !== b.priority) return b.priority - a.priority;
    if (a._c !== b._c) return a._c - b._c;
    return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
  }

  function before(a, b) {
    return compare(a, b) < 0;
  }

  /** Index of the first id in `ids` that `task` sorts before (binary search). */
  function positionOf(ids, task) {
    let lo = 0;
    let hi = ids.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      const other = tasks.get(ids[mid]);
      if (other.id === task.id || before(task, other)) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }

  function removeFromOrder(task) {
    const ids = order.get(task.stage);
    if (!ids) return;
    let i = positionOf(ids, task);
    if (ids[i] !== task.id) i = ids.indexOf(task.id); // its key changed under us: search
    if (i >= 0) ids.splice(i, 1);
  }

  function insertIntoOrder(task) {
    const ids = order.get(task.stage);
    if (!ids) return;
    ids.splice(positionOf(ids, task), 0, task.id);
  }

  function csrfToken() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  function formatDuration(ms) {
    const s = Math.max(0, Math.floor(ms / 1000));
    if (s < 60) return `${s}s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
  }

  /** A coarse age for "3m in RUNNING": seconds only in the first minute, then minutes, hours, days. */
  function formatAge(ms) {
    const s = Math.max(0, Math.floor(ms / 1000));
    if (s < 60) return `${s}s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m`;
    const h = Math.floor(m / 60);
    if (h < 24) return `${h}h ${m % 60}m`;
    return `${Math.floor(h / 24)}d ${h % 24}h`;
  }

  function json(value) {
    return value === null || value === undefined ? "—" : JSON.stringify(value, null, 2);
  }

  let messageTimer = null;
  function showMessage(text, kind = "info") {
    const box = document.getElementById("message");
    box.textContent = text;
    box.dataset.kind = kind;
    box.hidden = false;
    clearTimeout(messageTimer);
    messageTimer = setTimeout(() => { box.hidden = true; }, kind === "error" ? 15000 : 6000);
  }

  // ------------------------------------------------------------------------------------------
  // Connection

  const connectionEl = document.getElementById("connection");
  const columnsEl = document.getElementById("columns");
  let socket = null;
  let backoff = BACKOFF_FIRST_MS;
  let reconnectTimer = null;
  let sessionEnded = false;

  function setConnection(state, note) {
    connectionEl.dataset.state = state;
    const label = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", ended: "session ended" }[state];
    connectionEl.textContent = note ? `${label} (${note})` : label;
  }

  /** The login page, back to this very view afterwards (written as Django's login redirect writes it). */
  function loginUrl() {
    const next = encodeURIComponent(location.pathname + location.search).replace(/%2F/gi, "/");
    return `${LOGIN_URL}?next=${next}`;
  }

  // The session is gone (logged out, expired, deleted, or the user lost the right to watch):
  // reconnecting cannot help, so stop, and say what would. The server tells it by closing with
  // NOT_ALLOWED after accepting (board/consumers.py): a refusal before the handshake would
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
    columnsEl.classList.add("stale");
    setConnection("ended");
    const box = document.getElementById("session-ended");
    box.querySelector("a").href = loginUrl();
    box.hidden = false;
  }

  function connect() {
    reconnectTimer = null;
    if (sessionEnded) return;
    setConnection(everLive ? "reconnecting" : "connecting");
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(`${scheme}${location.host}/ws/board/`);
    socket = ws;
    ws.onopen = () => { if (!window.boardReady) performance.mark("board-socket-open"); };
    ws.onmessage = (e) => {
      if (socket !== ws) return;
      if (!window.boardReady) performance.mark("board-message");
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
    };
  }

  function requestSnapshot() {
    if (snapshotRequested || !socket || socket.readyState !== WebSocket.OPEN) return;
    snapshotRequested = true;
    socket.send(JSON.stringify({ type: "snapshot" }));
  }

  // A large snapshot may come in parts (proposed server change: daphne refuses to send a
  // websocket message over 1 MiB): {"type": "snapshot", ..., "more": true}, then
  // {"type": "snapshot_more", "tasks": [...], "more": ...} until "more" is false.
  let partialSnapshot = null;

  function receive(message) {
    if (message.type === "snapshot" && message.more) partialSnapshot = message;
    else if (message.type === "snapshot_more" && partialSnapshot) {
      for (const task of message.tasks) partialSnapshot.tasks.push(task);
      if (!message.more) {
        const snap = partialSnapshot;
        partialSnapshot = null;
        onSnapshot(snap);
      }
    } else if (message.type === "snapshot") onSnapshot(message);
    else if (message.type === "task") onTask(message.event, message.task);
    else if (message.type === "tasks") { // a batch, oldest first (proposed server change)
      for (const item of message.items) onTask(item.event, item.task);
    }
    else if (message.type === "problems") { problems = message.problems; renderProblems(); }
    // Hook (issue 11, agents and throughput): the panel lives in insights.js.
    else if (message.type === "insights") { if (window.TaskflowInsights) window.TaskflowInsights.update(message); }
  }

  // ------------------------------------------------------------------------------------------
  // Applying what the server says

  let snapshotsTaken = 0;

  function onSnapshot(snap) {
    snapshotsTaken++;
    snapshotRequested = false;
    backoff = BACKOFF_FIRST_MS;
    tasks.clear();
    dependents.clear();
    for (const s of STAGES) order.set(s, []);
    counts = Object.fromEntries(STAGES.map((s) => [s, snap.counts[s] || 0]));
    snapshotEventId = snap.last_event_id || 0;
    maxEventId = snapshotEventId;
    missingEvents.clear();
    for (const task of snap.tasks) addTask(prepare(task));
    // The server sends them in this order; sorting here too keeps the binary searches exact
    // (times are compared in milliseconds here).
    for (const ids of order.values()) ids.sort((a, b) => compare(tasks.get(a), tasks.get(b)));
    for (const task of olderTerminal.values()) {
      if (!tasks.has(task.id)) {
        tasks.set(task.id, task);
        insertIntoOrder(task);
        linkDeps(task);
      }
    }
    problems = snap.problems || [];
    if (!window.boardReady) performance.mark("board-state-built");
    renderAll();
    if (!window.boardReady) performance.mark("board-dom-built");
    everLive = true;
    setConnection("live");
    columnsEl.classList.remove("stale");
    openTaskFromUrl();
    if (!window.boardReady) {
      // The first snapshot is on screen after the next frame: the benchmark reads this mark.
      requestAnimationFrame(() => setTimeout(() => {
        if (window.boardReady) return;
        performance.mark("board-rendered");
        window.boardReady = true;
        document.body.dataset.ready = "true";
      }, 0));
    }
  }

  function addTask(task) {
    tasks.set(task.id, task);
    order.get(task.stage)?.push(task.id);
    linkDeps(task);
  }

  function linkDeps(task) {
    for (const dep of task.deps || []) {
      let set = dependents.get(dep);
      if (!set) dependents.set(dep, (set = new Set()));
      set.add(task.id);
    }
  }

  function onTask(event, task) {
    noteEventId(event.id);
    const shown = tasks.get(task.id);
    if (!shown && event.id <= snapshotEventId) return; // the snapshot already holds this change
    if (shown && event.version > shown.version + 1) requestSnapshot(); // a lost message
    applyTask(task, { event });
  }

  // Event ids arrive in increasing order; one skipped over and still missing after a while
  // was lost on the way (a full channel drops messages): take a fresh snapshot.
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

  setInterval(() => {
    const now = performance.now();
    for (const [id, at] of missingEvents) {
      if (now - at > MISSING_EVENT_PATIENCE_MS) {
        missingEvents.clear();
        requestSnapshot();
        return;
      }
      if (id <= snapshotEventId) missingEvents.delete(id);
    }
  }, 1000);

  /** Show `task` if it is newer than what the page shows. Returns true when applied. */
  function applyTask(task, { event = null, older = false } = {}) {
    prepare(task);
    const shown = tasks.get(task.id);
    if (shown && task.version <= shown.version) return false;
    if (shown) {
      removeFromOrder(shown);
      if (shown.stage !== task.stage) {
        counts[shown.stage] = Math.max(0, (counts[shown.stage] || 0) - 1);
        counts[task.stage] = (counts[task.stage] || 0) + 1;
        markDependentsDirty(task.id);
      }
    } else if (!older) {
      counts[task.stage] = (counts[task.stage] || 0) + 1;
      markDependentsDirty(task.id);
    }
    tasks.set(task.id, task);
    insertIntoOrder(task);
    if (!shown) linkDeps(task);
    if (older) olderTerminal.set(task.id, task);
    markDirty(task.id);
    return true;
  }

  // ------------------------------------------------------------------------------------------
  // Rendering: everything once per snapshot, then single cards per frame

  const dirty = new Set();
  let frameRequested = false;
  let countsDirty = false;

  function markDirty(id) {
    dirty.add(id);
    countsDirty = true;
    scheduleFrame();
  }

  function markDependentsDirty(id) {
    const ids = dependents.get(id);
    if (ids) for (const dependent of ids) dirty.add(dependent);
  }

  function scheduleFrame() {
    if (frameRequested) return;
    frameRequested = true;
    const run = () => {
      if (!frameRequested) return;
      frameRequested = false;
      flush();
    };
    requestAnimationFrame(run);
    setTimeout(run, 300); // background tabs get no frames: still keep the DOM current
  }

  function cardsOf(stage) {
    return COLUMN_ELS.get(stage).querySelector(".cards");
  }

  // Cards sit in chunks of about CHUNK: the browser skips the style and layout of every chunk
  // out of view (content-visibility), which makes the first frame of 10,000 cards ~10x faster
  // than with the cards as direct children.
  const CHUNK = 100;
  const CARD_HEIGHT_GUESS = 90; // px, until a chunk has been rendered once

  function newChunk(size) {
    const chunk = el("div", "chunk");
    chunk.style.containIntrinsicHeight = `auto ${Math.max(1, size) * CARD_HEIGHT_GUESS}px`;
    return chunk;
  }

  function detach(card) {
    const chunk = card.parentNode;
    card.remove();
    if (chunk && chunk.classList.contains("chunk") && !chunk.firstChild) chunk.remove();
  }

  /** Put `card` right before `next` (a card in `container`), or at the end when null. */
  function place(container, card, next) {
    if (next) {
      const chunk = next.parentNode;
      chunk.insertBefore(card, next);
      if (chunk.childElementCount >= 2 * CHUNK) { // split a chunk that grew too big
        const second = newChunk(CHUNK);
        while (chunk.childElementCount > CHUNK) second.prepend(chunk.lastElementChild);
        chunk.after(second);
      }
      return;
    }
    let last = container.lastElementChild;
    if (!last || last.childElementCount >= CHUNK) container.append((last = newChunk(1)));
    last.append(card);
  }

  function renderAll() {
    dirty.clear();
    cards.clear();
    const filter = currentFilter();
    for (const stage of STAGES) {
      const fragment = document.createDocumentFragment();
      const ids = order.get(stage);
      for (let start = 0; start < ids.length; start += CHUNK) {
        const chunk = newChunk(Math.min(CHUNK, ids.length - start));
        for (const id of ids.slice(start, start + CHUNK)) {
          const card = buildCard(tasks.get(id), filter);
          cards.set(id, card);
          chunk.appendChild(card);
        }
        fragment.appendChild(chunk);
      }
      cardsOf(stage).replaceChildren(fragment);
    }
    refreshQueues();
    renderCounts();
    renderProblems();
    renderDetails(false);
    tickLeases();
    if (highlighted && cards.has(highlighted)) cards.get(highlighted).classList.add("highlight");
  }

  function flush() {
    if (dirty.size > 2000) {
      renderAll();
      return;
    }
    const filter = currentFilter();
    const ids = [...dirty];
    dirty.clear();
    // Create or refill every dirty card, then place each.
    const placed = [];
    for (const id of ids) {
      const task = tasks.get(id);
      if (!task) continue;
      let card = cards.get(id);
      if (card) fillCard(card, task, filter);
      else cards.set(id, (card = buildCard(task, filter)));
      placed.push(task);
    }
    // Take them out first: then every card still in a column is where the order says, and
    // each dirty card goes right before the nearest following card that is in place.
    for (const task of placed) detach(cards.get(task.id));
    for (const task of placed) {
      const card = cards.get(task.id);
      const column = order.get(task.stage);
      const container = cardsOf(task.stage);
      let i = positionOf(column, task);
      if (column[i] !== task.id) i = column.indexOf(task.id);
      let next = null;
      for (i += 1; i < column.length; i++) {
        const candidate = cards.get(column[i]);
        if (candidate && candidate.parentNode && candidate.parentNode.parentNode === container) {
          next = candidate;
          break;
        }
      }
      place(container, card, next);
    }
    if (countsDirty) {
      countsDirty = false;
      renderCounts();
    }
    if (detailsId && ids.includes(detailsId)) renderDetails(true);
    refreshQueues();
  }

  function renderCounts() {
    const shown = matchingCounts();
    // A board with no task at all says how to get some (the hints are in board.html).
    document.getElementById("empty-board").hidden = STAGES.some((s) => counts[s] > 0);
    for (const stage of STAGES) {
      const column = COLUMN_ELS.get(stage);
      column.classList.toggle("empty", !(counts[stage] > 0));
      column.querySelector("h2 .count").textContent = shown ? `${shown[stage]} of ${counts[stage] || 0}` : counts[stage] || 0;
      const more = column.querySelector(".show-more");
      if (more && TERMINAL.has(stage)) {
        const hidden = (counts[stage] || 0) - order.get(stage).length;
        more.hidden = hidden <= 0 || showMoreCursor.get(stage) === null;
        more.textContent = `show more (${hidden} older)`;
      }
    }
  }

  function buildCard(task, filter) {
    const card = el("article", "card");
    card.dataset.id = task.id;
    card.tabIndex = 0;
    if (CAN_INTERVENE) card.draggable = true;
    fillCard(card, task, filter);
    return card;
  }

  function depDone(dep) {
    const task = tasks.get(dep) || depInfo.get(dep);
    if (!task) {
      fetchDep(dep);
      return null;
    }
    return task.stage === "COMPLETED";
  }

  // A card is kept small (a few elements): 10,000 of them must build and lay out quickly.
  function fillCard(card, task, filter) {
    card.dataset.stage = task.stage;
    card.dataset.version = task.version;
    card.hidden = filter ? !matches(task, filter) : false;
    const head = el("div", "card-head");
    head.append(el("b", "card-id", task.id), ` P${task.priority} · ${task.queue}`, adminLink(task.id));
    const meta = el("div", "card-meta");
    // Fence and version are in the details panel: the card says who, how often, how long.
    card._inStage = el("span", "in-stage");
    card._inStageText = "";
    meta.append(el("span", "owner", task.owner || "—"),
      ` · attempts ${task.attempts}/${task.max_retries + 1} · `, card._inStage);
    updateInStage(card, task, Date.now());
    card._lease = null;
    if (task.stage === "RUNNING" && task._l !== null) {
      card._lease = el("span", "lease");
      meta.append(" ", card._lease);
    }
    const parts = [head, el("div", "card-title", task.title), meta];
    const progress = task.progress !== null && task.progress !== undefined;
    const held = task.hold && task.stage === "PENDING";
    const { error, attempt } = troubleBadges(task);
    if (error || attempt || held || progress) {
      const badges = el("div", "badges");
      if (error) {
        const b = el("span", "badge bad failed", "error");
        b.title = task.error;
        badges.append(b);
      }
      if (attempt) badges.append(el("span", "badge bad retried", `attempt ${task.attempts}`));
      if (held) badges.append(el("span", "badge", "held"));
      if (progress) badges.append(el("span", "badge", `${Math.round(task.progress * 100)}%`));
      parts.push(badges);
    }
    if (task.deps && task.deps.length) {
      const deps = el("ul", "deps");
      for (const dep of task.deps) {
        const done = depDone(dep);
        const li = el("li", done ? "dep done" : done === false ? "dep todo" : "dep unknown", `${done ? "✓" : done === false ? "…" : "?"} ${dep}`);
        li.dataset.dep = dep;
        deps.append(li);
      }
      parts.push(deps);
    }
    card.replaceChildren(...parts);
    card.classList.remove("lease-expired");
    if (card._lease) updateLease(card, task, Date.now());
  }

  /** Which red badges a card wears. The last error and the attempt count stay on a task for
   * good, but they are news only where they matter: QUEUED again after a failed attempt,
   * RUNNING on a retry, and FAILED. A task that completed on its second try shows neither. */
  function troubleBadges(task) {
    const stage = task.stage;
    const retried = stage === "QUEUED" && task.attempts > 0;
    return {
      error: !!task.error && (stage === "FAILED" || retried || (stage === "RUNNING" && task.attempts > 1)),
      attempt: task.attempts > 1 && (stage === "FAILED" || stage === "RUNNING" || retried),
    };
  }

  /** "3m in RUNNING", from when the task entered its stage, on the client's clock. Written only
   * when the text changes (once a minute past the first), so ticking 10,000 cards costs little. */
  function updateInStage(card, task, now) {
    const text = `${formatAge(now - task._s)} in ${task.stage}`;
    if (text === card._inStageText) return;
    card._inStageText = text;
    card._inStage.textContent = text;
  }

  function tickStages() {
    const now = Date.now();
    for (const [id, card] of cards) {
      const task = tasks.get(id);
      if (task && card._inStage) updateInStage(card, task, now);
    }
  }
  setInterval(tickStages, 1000);

  // The countdown to each lease's expiry, ticking once a second on the client's clock; past
  // zero it turns into a red badge.
  function updateLease(card, task, now) {
    const lease = card._lease;
    if (!lease) return;
    const left = task._l - now;
    const expired = left <= 0;
    lease.textContent = expired ? `lease expired ${formatDuration(-left)} ago` : `lease ${formatDuration(left)}`;
    if (expired !== card.classList.contains("lease-expired")) {
      lease.className = expired ? "lease badge bad" : "lease";
      card.classList.toggle("lease-expired", expired);
    }
  }

  function tickLeases() {
    const now = Date.now();
    for (const id of order.get("RUNNING") || []) {
      const card = cards.get(id);
      if (card) updateLease(card, tasks.get(id), now);
    }
  }
  setInterval(tickLeases, 1000);

  // Dependencies that are not on the board (finished long ago): ask the API, a few at a time.
  const depQueue = [];
  const depAsked = new Set();
  let depFetching = 0;
  function fetchDep(id) {
    if (depAsked.has(id) || depAsked.size >= 1000) return; // shown as "?" past that
    depAsked.add(id);
    depQueue.push(id);
    pumpDeps();
  }
  function pumpDeps() {
    while (depFetching < 4 && depQueue.length) {
      const id = depQueue.shift();
      depFetching++;
      fetch(`/api/tasks/${encodeURIComponent(id)}`, { credentials: "same-origin" })
        .then((r) => (r.ok ? r.json() : r.status === 404 ? { id, stage: "UNKNOWN" } : null))
        .then((task) => {
          if (!task) return;
          depInfo.set(id, { stage: task.stage });
          markDependentsDirty(id);
          scheduleFrame();
        })
        .catch(() => {})
        .finally(() => { depFetching--; pumpDeps(); });
    }
  }

  // ------------------------------------------------------------------------------------------
  // Filters

  const filterText = document.getElementById("filter-text");
  const filterOwner = document.getElementById("filter-owner");
  const filterQueue = document.getElementById("filter-queue");
  const filterStage = document.getElementById("filter-stage");

  function currentFilter() {
    const text = filterText.value.trim().toLowerCase();
    const owner = filterOwner.value.trim().toLowerCase();
    const queue = filterQueue.value;
    return text || owner || queue ? { text, owner, queue } : null;
  }

  function matches(task, f) {
    if (f.queue && task.queue !== f.queue) return false;
    if (f.owner && !(task.owner || "").toLowerCase().includes(f.owner)) return false;
    if (f.text && !task.id.toLowerCase().includes(f.text) && !task.title.toLowerCase().includes(f.text)) return false;
    return true;
  }

  /** Per stage, how many of the tasks on the board match the filter; null when none is set.
   * (Finished columns hold only their most recent tasks: "3 of 120" counts among those.) */
  function matchingCounts() {
    const f = currentFilter();
    if (!f) return null;
    const out = {};
    for (const [stage, ids] of order) {
      let n = 0;
      for (const id of ids) if (matches(tasks.get(id), f)) n++;
      out[stage] = n;
    }
    return out;
  }

  function applyFilters() {
    const f = currentFilter();
    for (const [id, card] of cards) card.hidden = f ? !matches(tasks.get(id), f) : false;
    columnsEl.classList.toggle("filtered", !!f);
    // A stage filter shows that column only.
    for (const [stage, column] of COLUMN_ELS) column.hidden = !!filterStage.value && stage !== filterStage.value;
    renderCounts();
    writeUrl("replace");
  }

  let filterTimer = null;
  for (const input of [filterText, filterOwner, filterQueue, filterStage]) {
    input.addEventListener("input", () => {
      clearTimeout(filterTimer);
      filterTimer = setTimeout(applyFilters, 80);
    });
  }

  // ------------------------------------------------------------------------------------------
  // The view in the URL: /board/?q=&owner=&queue=&stage=&task= (a link shows the same view).
  // Filters replace the history entry as they are typed; opening or closing a task adds one,
  // so that back and forward walk the tasks looked at.

  let restoring = false; // applying the URL: write nothing back
  let taskFromUrl = null; // a task the URL names, opened once the first snapshot is here

  function urlOfView() {
    const params = new URLSearchParams();
    const put = (name, value) => { if (value.trim()) params.set(name, value); };
    put("q", filterText.value);
    put("owner", filterOwner.value);
    put("queue", filterQueue.value);
    put("stage", filterStage.value);
    const task = detailsId || taskFromUrl;
    if (task) params.set("task", task);
    const query = params.toString();
    return location.pathname + (query ? `?${query}` : "") + location.hash;
  }

  function writeUrl(how) {
    if (restoring) return;
    const url = urlOfView();
    if (url === location.pathname + location.search + location.hash) return;
    if (how === "push") history.pushState(null, "", url);
    else history.replaceState(null, "", url);
  }

  function restoreView() {
    const params = new URLSearchParams(location.search);
    restoring = true;
    try {
      filterText.value = params.get("q") || "";
      filterOwner.value = params.get("owner") || "";
      const queue = params.get("queue") || "";
      if (queue && !knownQueues.has(queue)) {
        knownQueues.add(queue);
        filterQueue.append(new Option(queue, queue)); // sorted in when the next queue shows up
      }
      filterQueue.value = queue;
      const stage = params.get("stage") || "";
      filterStage.value = STAGES.includes(stage) ? stage : "";
      applyFilters();
      const task = params.get("task");
      if (!task) {
        taskFromUrl = null;
        if (detailsId) closeDetails();
      } else if (task !== detailsId) {
        taskFromUrl = task;
        if (everLive) openTaskFromUrl();
      }
    } finally {
      restoring = false;
    }
  }

  window.addEventListener("popstate", restoreView);

  /** Open the task the URL names: from the board, or from the API when it is not loaded
   * (an older finished task); it then stays on the board like a "show more" one. */
  async function openTaskFromUrl() {
    const id = taskFromUrl;
    if (!id) return;
    if (!tasks.has(id)) {
      let task = null;
      try {
        const response = await fetch(`/api/tasks/${encodeURIComponent(id)}`, { credentials: "same-origin" });
        if (response.ok) task = await response.json();
        else if (response.status !== 404) throw new Error(`HTTP ${response.status}`);
      } catch (err) {
        showMessage(`could not load task ${id}: ${err.message || err}`, "error");
        return;
      }
      if (taskFromUrl !== id) return; // the URL moved on meanwhile
      if (!task) {
        taskFromUrl = null;
        writeUrl("replace");
        showMessage(`task ${id} does not exist`, "error");
        return;
      }
      if (!tasks.has(id)) applyTask(task, { older: true });
    }
    if (taskFromUrl !== id) return;
    taskFromUrl = null;
    restoring = true;
    try {
      openDetails(id);
    } finally {
      restoring = false;
    }
  }

  /** The admin's change page of a task: its id quoted as django.contrib.admin.utils.quote does. */
  function adminUrl(id) {
    const quoted = id.replace(/[":/_#?;@&=+$,[\]<>%\n\\]/g, (c) => `_${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, "0")}`);
    return `${ADMIN_URL}board/task/${encodeURIComponent(quoted)}/change/`;
  }

  function adminLink(id) {
    const a = el("a", "admin-link", "admin");
    a.href = adminUrl(id);
    a.title = `${id} in the admin`;
    return a;
  }

  const knownQueues = new Set();
  const knownOwners = new Set();
  function refreshQueues() {
    let changedQueues = false;
    let changedOwners = false;
    for (const task of tasks.values()) {
      if (!knownQueues.has(task.queue)) { knownQueues.add(task.queue); changedQueues = true; }
      if (task.owner && !knownOwners.has(task.owner)) { knownOwners.add(task.owner); changedOwners = true; }
      if (knownOwners.size > 500) break;
    }
    if (changedQueues) {
      const selected = filterQueue.value;
      const options = [new Option("all queues", "")];
      for (const q of [...knownQueues].sort()) options.push(new Option(q, q));
      filterQueue.replaceChildren(...options);
      filterQueue.value = selected;
    }
    if (changedOwners) {
      document.getElementById("owners").replaceChildren(...[...knownOwners].sort().map((o) => new Option(o, o)));
    }
  }

  // ------------------------------------------------------------------------------------------
  // Problems

  function renderProblems() {
    const panel = document.getElementById("problems");
    panel.querySelector("h2 .count").textContent = problems.length;
    panel.classList.toggle("has-problems", problems.length > 0);
    const fragment = document.createDocumentFragment();
    for (const p of problems) {
      const li = el("li", "problem");
      li.dataset.task = p.task;
      li.dataset.code = p.code;
      li.tabIndex = 0;
      li.append(el("code", "problem-code", p.code), " ", el("span", "problem-task", p.task), el("div", "problem-text", p.text));
      fragment.append(li);
    }
    panel.querySelector("ul").replaceChildren(fragment);
  }

  function highlight(id) {
    if (highlighted) cards.get(highlighted)?.classList.remove("highlight");
    highlighted = id;
    const card = cards.get(id);
    if (!card) {
      showMessage(`task ${id} is not on the board (finished long ago, or unknown)`, "error");
      return;
    }
    if (card.hidden || card.closest(".column").hidden) {
      filterText.value = filterOwner.value = filterQueue.value = filterStage.value = "";
      applyFilters();
    }
    card.classList.add("highlight");
    card.scrollIntoView({ block: "center", inline: "nearest" });
  }

  document.querySelector("#problems ul").addEventListener("click", (e) => {
    const li = e.target.closest("li.problem");
    if (li) highlight(li.dataset.task);
  });
  document.querySelector("#problems ul").addEventListener("keydown", (e) => {
    const li = e.target.closest("li.problem");
    if (li && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); highlight(li.dataset.task); }
  });

  // ------------------------------------------------------------------------------------------
  // Details

  const details = document.getElementById("details");
  let historyFor = null; // "id@version" the history shown was fetched for
  let detailsFull = null; // the full task from the API, for the details

  function openDetails(id) {
    detailsId = id;
    historyFor = null;
    detailsFull = null;
    details.hidden = false;
    details.querySelector(".details-admin").href = adminUrl(id);
    renderDetails(true);
    // Keyboard users land in the panel (its heading; Tab goes on to the actions), and go back
    // to the card they came from when it closes.
    details.querySelector(".details-title").focus();
    writeUrl("push");
  }

  function closeDetails() {
    if (detailsId === null) return;
    const id = detailsId;
    detailsId = null;
    details.hidden = true;
    const card = cards.get(id);
    if (card && card.isConnected && !card.hidden) card.focus();
    writeUrl("push");
  }

  details.querySelector(".close").addEventListener("click", closeDetails);
  document.addEventListener("keydown", (e) => {
    // Escape in the cancel dialog closes only the dialog (the browser does that).
    if (e.key === "Escape" && !cancelDialog.open) closeDetails();
  });

  function field(dl, name, value, pre = false) {
    dl.append(el("dt", null, name));
    const dd = el("dd");
    if (pre) dd.append(el("pre", null, value));
    else dd.textContent = value;
    dl.append(dd);
  }

  function renderDetails(refetch) {
    if (!detailsId) return;
    const shown = tasks.get(detailsId);
    if (!shown) { closeDetails(); return; }
    // The full task (payload, checkpoint, result...) comes from the API: the board's messages
    // need not carry it. Until it arrives, or when the board has a newer version, show that.
    const task = detailsFull && detailsFull.id === shown.id && detailsFull.version >= shown.version ? detailsFull : shown;
    details.dataset.id = task.id;
    details.querySelector(".details-title").textContent = `${task.id}: ${task.title}`;
    const dl = el("dl");
    field(dl, "stage", `${task.stage} (version ${task.version}) since ${new Date(task._s).toLocaleString()}`);
    field(dl, "owner", task.owner || "—");
    field(dl, "queue / priority", `${task.queue} / ${task.priority}`);
    field(dl, "attempts", `${task.attempts} of ${task.max_retries + 1}`);
    field(dl, "fence", String(task.fence));
    if (task.lease_expires_at) field(dl, "lease until", new Date(task._l).toLocaleString());
    if (task.not_before) field(dl, "not before", new Date(task.not_before).toLocaleString());
    field(dl, "dependencies", (task.deps || []).map((d) => `${d} ${depDone(d) ? "✓ done" : "(not done)"}`).join(", ") || "none");
    field(dl, "description", task.description || "—", true);
    field(dl, "payload", json(task.payload), true);
    field(dl, "checkpoint", json(task.checkpoint), true);
    field(dl, "progress", task.progress === null || task.progress === undefined ? "—" : `${Math.round(task.progress * 100)}%`);
    if (task.result !== null && task.result !== undefined) field(dl, "result", json(task.result), true);
    if (task.error) field(dl, "last error", task.error, true);
    field(dl, "created / updated", `${new Date(task._c).toLocaleString()} / ${new Date(task._u).toLocaleString()}`);
    details.querySelector(".details-body").replaceChildren(dl);

    const buttons = [];
    for (const action of ACTIONS.get(shown.stage)) {
      const b = el("button", "action", action.label);
      b.type = "button";
      b.dataset.verb = action.verb;
      b.addEventListener("click", () => act(shown.id, action));
      buttons.push(b);
      const blockedBy = action.verb === "admit" ? unfinishedDeps(shown) : [];
      if (blockedBy.length) {
        // The server would refuse it (blocked): say why instead of offering it.
        const why = `Blocked: waiting for ${blockedBy.join(", ")} to complete`;
        b.disabled = true;
        b.title = why;
        const note = el("span", "action-note", why);
        note.id = "admit-blocked-note";
        b.setAttribute("aria-describedby", note.id);
        buttons.push(note);
      }
    }
    details.querySelector(".details-actions").replaceChildren(...buttons);
    const key = `${shown.id}@${shown.version}`;
    if (refetch && historyFor !== key) {
      historyFor = key;
      loadFull(shown.id, key);
      loadHistory(shown.id, key);
    }
  }

  async function loadFull(id, key) {
    try {
      const response = await fetch(`/api/tasks/${encodeURIComponent(id)}`, { credentials: "same-origin" });
      if (!response.ok) return;
      const task = prepare(await response.json());
      if (historyFor !== key) return;
      detailsFull = task;
      if (!applyTask(task)) renderDetails(false); // a newer version re-renders by itself
    } catch (err) {
      // the board's copy stays shown
    }
  }

  async function loadHistory(id, key) {
    const list = details.querySelector(".history");
    const items = [];
    let cursor = null;
    try {
      for (let page = 0; page < 20; page++) {
        const url = `/api/tasks/${encodeURIComponent(id)}/events?limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
        const response = await fetch(url, { credentials: "same-origin" });
        if (!response.ok) throw new Error(`history: HTTP ${response.status}`);
        const body = await response.json();
        items.push(...body.items);
        cursor = body.next;
        if (!cursor) break;
      }
    } catch (err) {
      if (historyFor === key) list.replaceChildren(el("li", "error", String(err.message || err)));
      return;
    }
    if (historyFor !== key) return; // another task (or version) is shown now
    // Hook (issue 11, attempt timeline): one entry per attempt, drawn by attempts.js.
    const attemptsSlot = details.querySelector(".attempts-slot");
    if (attemptsSlot && window.TaskflowAttempts) attemptsSlot.replaceChildren(window.TaskflowAttempts.render(items, tasks.get(id)));
    list.replaceChildren(...items.map((e) => {
      const li = el("li", "history-item");
      li.dataset.verb = e.verb;
      li.append(
        el("time", null, new Date(e.at).toLocaleString()), " ",
        el("strong", null, e.verb), ` ${e.from_stage || "∅"} → ${e.to_stage} · v${e.version} · fence ${e.fence}`,
        e.actor ? ` · ${e.actor}` : "",
      );
      if (e.detail) li.append(el("pre", "detail", JSON.stringify(e.detail)));
      return li;
    }));
  }

  /** The dependencies of `task` not known to be COMPLETED (unknown ones count: the server
   * admits only when every one has completed). */
  function unfinishedDeps(task) {
    return (task.deps || []).filter((d) => depDone(d) !== true);
  }

  document.getElementById("columns").addEventListener("click", (e) => {
    const card = e.target.closest(".card");
    if (card && !e.target.closest("a")) openDetails(card.dataset.id); // a link goes where it says
  });
  document.getElementById("columns").addEventListener("keydown", (e) => {
    const card = e.target.closest(".card");
    if (card && e.key === "Enter" && !e.target.closest("a")) openDetails(card.dataset.id);
  });

  // ------------------------------------------------------------------------------------------
  // Human actions (buttons and drag and drop)

  // ------------------------------------------------------------------------------------------
  // Cancel asks first: a reason for the history, and which waiting tasks it strands

  const cancelDialog = document.getElementById("cancel-dialog");
  const STRANDABLE = new Set(["PENDING", "QUEUED", "RUNNING", "PAUSED"]); // as check()'s dead_dep

  /** The tasks that wait for `id`, directly or down the chain, and that a cancel leaves unable
   * to run: {ids (sorted), complete}. Only live tasks are walked (a finished one waits for
   * nothing), and every live task is on the page (the snapshot holds them all); `complete` is
   * false when a live column holds fewer cards than its count says. */
  function strandedBy(id) {
    const found = new Set();
    const todo = [id];
    while (todo.length) {
      for (const next of dependents.get(todo.pop()) || []) {
        const task = tasks.get(next);
        if (found.has(next) || !task || !STRANDABLE.has(task.stage)) continue;
        found.add(next);
        todo.push(next);
      }
    }
    const complete = STAGES.every((s) => TERMINAL.has(s) || order.get(s).length >= (counts[s] || 0));
    return { ids: [...found].sort(), complete };
  }

  /** Ask before cancelling `id`: resolves to {reason} when confirmed, null when dismissed. */
  function confirmCancel(id) {
    const { ids, complete } = strandedBy(id);
    cancelDialog.querySelector(".cancel-task").textContent = id;
    const list = cancelDialog.querySelector(".stranded");
    const shown = ids.slice(0, 50);
    list.replaceChildren(...shown.map((d) => el("li", null, `${d}: ${tasks.get(d).title}`)));
    if (ids.length > shown.length) list.append(el("li", null, `and ${ids.length - shown.length} more`));
    if (!complete) list.append(el("li", "possibly-more", "and possibly more (the board has not loaded every task)"));
    cancelDialog.querySelector(".stranded-none").hidden = ids.length > 0 || !complete;
    cancelDialog.querySelector(".stranded-some").hidden = ids.length === 0 && complete;
    const reason = cancelDialog.querySelector("textarea");
    reason.value = "";
    cancelDialog.returnValue = "";
    return new Promise((resolve) => {
      cancelDialog.addEventListener("close", () => {
        resolve(cancelDialog.returnValue === "confirm" ? { reason: reason.value.trim() } : null);
      }, { once: true });
      cancelDialog.showModal();
      reason.focus();
    });
  }

  async function act(id, action) {
    const task = tasks.get(id);
    if (!task) return;
    if (action.verb === "cancel") {
      const answer = await confirmCancel(id);
      if (!answer) return; // dismissed: nothing sent, nothing moved
      action = { ...action, extra: { ...action.extra, ...(answer.reason ? { reason: answer.reason } : {}) } };
    }
    const card = cards.get(id);
    if (card) {
      card.classList.add("pending");
      if (action.to !== task.stage) { // shown where it is going until the server answers
        detach(card);
        const container = cardsOf(action.to);
        if (!container.firstElementChild) container.append(newChunk(1));
        container.firstElementChild.prepend(card);
      }
    }
    let response = null;
    let body = null;
    try {
      response = await fetch(`/api/tasks/${encodeURIComponent(id)}/${action.path}`, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify({ version: task.version, ...action.extra }),
      });
      body = await response.json().catch(() => null);
    } catch (err) {
      body = { error: { message: `network error: ${err.message || err}` } };
    }
    card?.classList.remove("pending");
    if (response && response.ok && body && body.id) {
      applyTask(body);
      showMessage(`${action.label}: ${id} is now ${body.stage}`);
    } else {
      const error = (body && body.error) || {};
      if (error.task) applyTask(error.task);
      const what = error.message || (response ? `HTTP ${response.status}` : "no answer");
      showMessage(`${action.label} ${id} refused: ${what}`, "error");
    }
    markDirty(id); // back where the state says it is
    if (detailsId === id) renderDetails(true);
  }

  let dragging = null; // {id, targets: Map stage -> action}

  function clearDropTargets() {
    for (const column of COLUMN_ELS.values()) column.classList.remove("drop-ok", "drop-over", "drop-no");
    document.body.classList.remove("dragging");
  }

  if (CAN_INTERVENE) {
    const columns = document.getElementById("columns");
    columns.addEventListener("dragstart", (e) => {
      const card = e.target.closest?.(".card");
      const task = card && tasks.get(card.dataset.id);
      if (!task) return;
      const targets = new Map(ACTIONS.get(task.stage).map((a) => [a.to, a]));
      dragging = { id: task.id, targets };
      e.dataTransfer.effectAllowed = "move";
      e.dataTransfer.setData("text/plain", task.id);
      document.body.classList.add("dragging");
      for (const [stage, column] of COLUMN_ELS) {
        column.classList.add(targets.has(stage) ? "drop-ok" : "drop-no");
      }
    });
    columns.addEventListener("dragend", () => {
      dragging = null;
      clearDropTargets();
    });
    for (const [stage, column] of COLUMN_ELS) {
      column.addEventListener("dragover", (e) => {
        if (!dragging || !dragging.targets.has(stage)) return; // not offered: the drop is refused
        e.preventDefault();
        e.dataTransfer.dropEffect = "move";
        column.classList.add("drop-over");
      });
      column.addEventListener("dragleave", (e) => {
        if (!column.contains(e.relatedTarget)) column.classList.remove("drop-over");
      });
      column.addEventListener("drop", (e) => {
        if (!dragging || !dragging.targets.has(stage)) return;
        e.preventDefault();
        const { id, targets } = dragging;
        dragging = null;
        clearDropTargets();
        act(id, targets.get(stage));
      });
    }
  }

  // ------------------------------------------------------------------------------------------
  // Terminal columns: "show more" loads older finished tasks from the API

  for (const stage of TERMINAL) {
    const button = COLUMN_ELS.get(stage)?.querySelector(".show-more");
    if (!button) continue;
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        // The API lists oldest first; pages of it are merged into the column, which stays
        // sorted most recent first (see the report: a newest-first listing would fit better).
        let added = 0;
        while (added === 0) {
          const cursor = showMoreCursor.get(stage);
          if (cursor === null) break;
          const url = `/api/tasks?stage=${stage}&limit=${SHOW_MORE_PAGE}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
          const response = await fetch(url, { credentials: "same-origin" });
          if (!response.ok) throw new Error(`HTTP ${response.status}`);
          const page = await response.json();
          for (const task of page.items) if (applyTask(task, { older: true })) added++;
          showMoreCursor.set(stage, page.next || null);
        }
        countsDirty = true;
        scheduleFrame();
      } catch (err) {
        showMessage(`could not load more ${stage} tasks: ${err.message || err}`, "error");
      } finally {
        button.disabled = false;
      }
    });
  }

  // A read-only view for tests and debugging.
  window.taskflowBoard = {
    tasks,
    counts: () => ({ ...counts }),
    snapshots: () => snapshotsTaken,
    reconnecting: () => socket !== null || reconnectTimer !== null,
    shown: (id) => {
      const card = cards.get(id);
      return card && card.isConnected ? { stage: card.closest(".column").dataset.stage, version: Number(card.dataset.version) } : null;
    },
  };

  restoreView();
  connect();
})();
