// Drawing the board from the model (store.js): the cards in their columns, each column's count
// and "show more", the problems panel. A snapshot builds every column once (DocumentFragment);
// after that a change redraws only its cards (and those of the tasks that wait for it), batched
// per animation frame. Columns are virtualized by chunks of cards: a chunk far from its
// column's view holds its cards' ids, not their elements. Leases count down and "3m in RUNNING"
// ages tick once a second on the client's clock. It follows the model's changes (store.js) and
// the view's filters (view.js).

import {
  adminUrl, CAN_INTERVENE, COLUMN_ELS, el, frameBatcher, mayAnswer, requiresText, resourcesText, setText, showMessage, STAGES,
  TERMINAL,
} from "./page.js";
import {
  allTasks, columnGrowth, countIn, depDead, depDone, getProblems, getTask, problemsChecked, idsIn, moreCursor, positionOf, queueClosed,
  keyFull,
  rateKeyHeld, fairnessKeySpent, resourceWait, strandedWhy, subscribe, unclaimableWhy, waitingApprovalOf,
} from "./store.js";
import { loadMore, unloadColumnTail } from "./api.js";
import {
  clearFilters, currentFilter, currentMatches, loadMoreMatching, matches, matchingCounts, matchingLoaded, openTaskId,
  refreshFilterChoices, subscribeView,
} from "./view.js";

const cards = new Map(); // id -> card element (only for tasks on the board)

const dirty = new Set();
let countsDirty = false;
// The problems a card shows (stranded: dead_dep; no capable agent: unclaimable_requirements), as
// task id -> its codes, as last drawn: a problems frame redraws only the cards whose codes changed.
const CARD_PROBLEMS = new Set(["dead_dep", "unclaimable_requirements"]);
let cardProblems = new Map();
function cardProblemsNow() {
  const now = new Map();
  for (const p of getProblems()) {
    if (CARD_PROBLEMS.has(p.code)) now.set(p.task, `${now.get(p.task) || ""} ${p.code}`);
  }
  return now;
}
let highlighted = null; // the card a problem pointed at
const scheduleFrame = frameBatcher(() => flush());

/** The card of task `id`, or undefined when it has none. */
export function cardOf(id) {
  return cards.get(id);
}

/** Draw task `id`'s card again, where the model says it is (after an action moved it). */
export function markDirty(id) {
  dirty.add(id);
  countsDirty = true;
  scheduleFrame();
}

export function cardsOf(stage) {
  return COLUMN_ELS.get(stage).querySelector(".cards");
}

// Cards sit in chunks of about CHUNK: the browser skips the style and layout of every chunk
// out of view (content-visibility), which makes the first frame of 10,000 cards ~10x faster
// than with the cards as direct children.
const CHUNK = 100;
const CARD_HEIGHT_GUESS = 90; // px, until a chunk has been rendered once

export function newChunk(size) {
  const chunk = el("div", "chunk");
  chunk.style.containIntrinsicHeight = `auto ${Math.max(1, size) * CARD_HEIGHT_GUESS}px`;
  return chunk;
}

export function detach(card) {
  const chunk = card.parentNode;
  card.remove();
  if (chunk && chunk.classList.contains("chunk") && !chunk.firstChild) chunk.remove();
}

// ------------------------------------------------------------------------------------------
// Virtualized columns (issue 31): a chunk more than a screen away from its column's view lets go
// of its cards and keeps, in their place, their ids in order and their height (a "hollow" chunk);
// scrolled near again, it draws them from the model. So the DOM holds what is on screen plus a
// margin, whatever the column's length. A change to a task of a hollow chunk takes its id out;
// a card whose place is among a hollow chunk's ids goes in as an id.
const hollowOf = new Map(); // id -> the hollow chunk that holds its place
const NEAR = "100% 0px"; // the margin, above and below a column's view, in which chunks hold cards

function watchChunks(list) {
  const near = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const chunk = entry.target;
      // A column not drawn (a stage filter, the board at a past moment) measures nothing: kept.
      if (chunk.parentNode !== list || (!entry.isIntersecting && !list.offsetParent)) continue;
      if (entry.isIntersecting) fillChunk(chunk);
      else hollowChunk(chunk);
    }
  }, { root: list, rootMargin: NEAR });
  for (const chunk of list.children) near.observe(chunk);
  new MutationObserver((records) => {
    for (const record of records) {
      for (const node of record.addedNodes) near.observe(node);
      for (const node of record.removedNodes) near.unobserve(node);
    }
  }).observe(list, { childList: true });
}

/** A chunk's cards out, their ids and height kept; not a chunk whose card a person is on (the
 * highlighted one, one with keyboard focus, one whose action is in flight). */
function hollowChunk(chunk) {
  if (chunk.hollowIds || !chunk.firstChild) return;
  if ((highlighted && chunk.contains(cards.get(highlighted) || null)) || chunk.contains(document.activeElement)
      || chunk.querySelector(".pending")) return;
  const ids = [];
  let shown = 0;
  for (const card of chunk.children) {
    ids.push(card.dataset.id);
    if (!card.hidden) shown += 1;
  }
  // offsetHeight of a chunk the browser skips is its remembered size (contain-intrinsic-size: auto).
  chunk.cardHeight = shown ? chunk.offsetHeight / shown : CARD_HEIGHT_GUESS;
  chunk.hollowIds = ids;
  for (const id of ids) {
    cards.delete(id);
    hollowOf.set(id, chunk);
  }
  chunk.replaceChildren();
  sizeHollow(chunk);
}

/** A hollow chunk's cards drawn again from the model. */
function fillChunk(chunk) {
  const ids = chunk.hollowIds;
  if (!ids) return;
  chunk.hollowIds = null;
  chunk.style.height = "";
  const filter = currentFilter();
  const built = [];
  for (const id of ids) {
    hollowOf.delete(id);
    const task = getTask(id);
    if (!task) continue; // (a change to it takes it out of the chunk: only a safeguard)
    const card = buildCard(task, filter);
    if (id === highlighted) card.classList.add("highlight");
    cards.set(id, card);
    built.push(card);
  }
  if (!built.length) {
    chunk.remove();
    return;
  }
  chunk.replaceChildren(...built);
  while (chunk.childElementCount >= 2 * CHUNK) { // ids went in while it was hollow
    const second = newChunk(CHUNK);
    while (second.childElementCount < CHUNK) second.prepend(chunk.lastElementChild);
    chunk.after(second);
    guessHeight(second);
  }
  guessHeight(chunk);
}

/** A hollow chunk is as tall as its cards that the filter shows. */
function sizeHollow(chunk) {
  const filter = currentFilter();
  const shown = filter ? chunk.hollowIds.filter((id) => getTask(id) && matches(getTask(id), filter)).length : chunk.hollowIds.length;
  chunk.style.height = `${Math.round(shown * chunk.cardHeight)}px`;
}

/** Task `id` leaves the hollow chunk that held its place, if one did. */
function unhollow(id) {
  const chunk = hollowOf.get(id);
  if (!chunk) return;
  hollowOf.delete(id);
  chunk.hollowIds.splice(chunk.hollowIds.indexOf(id), 1);
  if (chunk.hollowIds.length) sizeHollow(chunk);
  else chunk.remove();
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
    guessHeight(chunk);
    return;
  }
  let last = container.lastElementChild;
  if (!last || last.hollowIds || last.childElementCount >= CHUNK) container.append((last = newChunk(1)));
  last.append(card);
  guessHeight(last);
}

/** A chunk not drawn yet is as tall as its cards would be (a page of cards appended to a new
 * chunk measured one card: the column's end looked near, and its next page loaded at once). */
function guessHeight(chunk) {
  chunk.style.containIntrinsicHeight = `auto ${chunk.childElementCount * CARD_HEIGHT_GUESS}px`;
}

/** Every column from scratch (after a snapshot, or when too many cards changed at once): the
 * chunks near the column's view drawn, the others hollow. */
function renderAll() {
  dirty.clear();
  cards.clear();
  hollowOf.clear();
  const filter = currentFilter();
  for (const stage of STAGES) {
    const fragment = document.createDocumentFragment();
    const ids = idsIn(stage);
    const list = cardsOf(stage);
    // Read only for a column of several chunks: reading them lays the page out (a snapshot's
    // columns hold one chunk each: its first frame is not held up).
    const top = ids.length > CHUNK ? list.scrollTop - list.clientHeight : 0;
    const bottom = ids.length > CHUNK ? list.scrollTop + 2 * list.clientHeight : 0;
    for (let start = 0; start < ids.length; start += CHUNK) {
      const chunk = newChunk(Math.min(CHUNK, ids.length - start));
      const part = ids.slice(start, start + CHUNK);
      if (start > 0 && (start * CARD_HEIGHT_GUESS > bottom || (start + part.length) * CARD_HEIGHT_GUESS < top)) {
        chunk.hollowIds = part;
        chunk.cardHeight = CARD_HEIGHT_GUESS;
        for (const id of part) hollowOf.set(id, chunk);
        sizeHollow(chunk);
      } else {
        for (const id of part) {
          const card = buildCard(getTask(id), filter);
          cards.set(id, card);
          chunk.appendChild(card);
        }
      }
      fragment.appendChild(chunk);
    }
    list.replaceChildren(fragment);
  }
  refreshFilterChoices();
  renderCounts();
  renderProblems();
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
    unhollow(id);
    const task = getTask(id);
    if (!task) { // no longer on the board (the prune deleted it): its card goes
      const gone = cards.get(id);
      if (gone) detach(gone);
      cards.delete(id);
      continue;
    }
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
    const column = idsIn(task.stage);
    const container = cardsOf(task.stage);
    let i = positionOf(column, task);
    if (column[i] !== task.id) i = column.indexOf(task.id);
    let next = null;
    let hollow = null;
    for (i += 1; i < column.length; i++) {
      const candidate = cards.get(column[i]);
      if (candidate && candidate.parentNode && candidate.parentNode.parentNode === container) {
        next = candidate;
        break;
      }
      hollow = hollowOf.get(column[i]);
      if (hollow && hollow.parentNode === container) break;
      hollow = null;
    }
    if (hollow) { // its place is among a hollow chunk's ids: it goes in as one
      cards.delete(task.id);
      hollow.hollowIds.splice(hollow.hollowIds.indexOf(column[i]), 0, task.id);
      hollowOf.set(task.id, hollow);
      if (hollow.hollowIds.length >= 2 * CHUNK) { // split, as a chunk of cards is
        const second = newChunk(CHUNK);
        second.hollowIds = hollow.hollowIds.splice(hollow.hollowIds.length - CHUNK);
        second.cardHeight = hollow.cardHeight;
        for (const id of second.hollowIds) hollowOf.set(id, second);
        hollow.after(second);
        sizeHollow(second);
      }
      sizeHollow(hollow);
    } else {
      place(container, card, next);
    }
  }
  if (countsDirty) {
    countsDirty = false;
    renderCounts();
  }
  refreshFilterChoices();
}

/** After a redraw: any column whose window no longer reaches its scrolled end loads on, and
 * any that the socket grew by more than GROWTH_MAX cards while its top is watched lets go of them. */
function loadWhereShort() {
  for (const stage of STAGES) {
    trimIfWatchedAtTop(stage);
    loadIfNearEnd(stage);
  }
}

// A column's cards stay bounded whatever the board does while a tab watches: a finished column
// takes every completion at its top, so it grew by a card per task finished. Past GROWTH_MAX
// cards added since its last load, when its list is scrolled less than a screen down (nobody
// reads its end), it goes back to as many cards as that load left (GROWTH_MAX at least), the
// newest first; scrolling down loads the others again, a page at a time. What a person loaded stays.
const GROWTH_MAX = 200;

function trimIfWatchedAtTop(stage) {
  const list = cardsOf(stage);
  // Not under a filter (its matches are not a window) nor with a task's details open (its card stays).
  if (columnGrowth(stage) <= GROWTH_MAX || currentFilter() || openTaskId() || !list.offsetParent) return;
  if (list.scrollTop < list.clientHeight) unloadColumnTail(stage, GROWTH_MAX);
}

function renderCounts() {
  const shown = matchingCounts();
  renderNoMatch(shown);
  // A board with no task at all says how to get some (the hints are in board.html).
  document.getElementById("empty-board").hidden = STAGES.some((s) => countIn(s) > 0);
  for (const stage of STAGES) {
    const column = COLUMN_ELS.get(stage);
    column.classList.toggle("empty", !(countIn(stage) > 0));
    column.querySelector("h2 .count").textContent = shown ? `${shown[stage]} of ${countIn(stage)}` : countIn(stage);
    const more = column.querySelector(".show-more");
    if (more) {
      // Under a filter: the matches the server counted that are not loaded yet.
      const server = shown && currentMatches();
      const hidden = server ? shown[stage] - matchingLoaded(stage) : countIn(stage) - idsIn(stage).length;
      more.hidden = hidden <= 0 || !(server ? server.more.get(stage) : moreCursor(stage));
      more.textContent = `show more (${hidden} ${TERMINAL.has(stage) ? "older" : "more"}${server ? " matching" : ""})`;
    }
  }
  requestAnimationFrame(loadWhereShort); // once the cards are laid out
}

/** A filter that hides every card of the shown columns says so, offers to clear it, and links
 * to the all-tasks table, which searches every task (the board holds the most recent finished
 * ones only). */
function renderNoMatch(shown) {
  const box = document.getElementById("no-match");
  const f = currentFilter();
  const visible = STAGES.filter((s) => !COLUMN_ELS.get(s).hidden);
  box.hidden = !(shown && f && visible.some((s) => countIn(s) > 0) && visible.every((s) => shown[s] === 0));
  if (box.hidden) return;
  const query = new URLSearchParams();
  if (f.text) query.set("text", f.text);
  if (f.search) query.set("search", f.search);
  if (f.queue) query.set("queue", f.queue);
  for (const s of visible.length < STAGES.length ? visible : []) query.append("stage", s);
  box.querySelector("a.search-all").href = `/board/tasks/?${query}`;
}

// ------------------------------------------------------------------------------------------
// Cards

function formatDuration(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
}

/** "ran 2m 10s · waited 5s" for a COMPLETED card whose figures the server sent ("" without). */
function runText(task) {
  const figures = [];
  if (typeof task.run_seconds === "number") figures.push(`ran ${formatDuration(task.run_seconds * 1000)}`);
  if (typeof task.wait_seconds === "number") figures.push(`waited ${formatDuration(task.wait_seconds * 1000)}`);
  return figures.join(" · ");
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

function adminLink(id) {
  const a = el("a", "admin-link", "admin");
  a.href = adminUrl(id);
  a.title = `${id} in the admin`;
  return a;
}

function buildCard(task, filter) {
  const card = el("article", "card");
  card.dataset.id = task.id;
  card.tabIndex = 0;
  if (CAN_INTERVENE) card.draggable = true;
  fillCard(card, task, filter);
  return card;
}

const DEADLINE_WHAT = {
  queue: "fails if not started by",
  attempt: "the attempt's time runs out at",
  progress: "the lease is taken back without progress by",
};

/** The task's next deadline in its stage, {at (ms), what}, or null: the earliest of those
 * board/engine/deadlines.py's `due` computes (the same clocks, from the card's fields). */
function deadlineOf(task) {
  const start = Date.parse(task.stage_changed_at);
  if (!(start >= 0)) return null;
  const since = (time) => { const t = time ? Date.parse(time) : NaN; return t > start ? t : start; };
  const due = [];
  if (task.stage === "QUEUED" && task.queue_timeout_seconds) {
    due.push(["queue", since(task.not_before) + task.queue_timeout_seconds * 1000]);
  } else if (task.stage === "RUNNING") {
    if (task.attempt_timeout_seconds) due.push(["attempt", start + task.attempt_timeout_seconds * 1000]);
    if (task.progress_timeout_seconds) {
      due.push(["progress", since(task.progress_changed_at) + task.progress_timeout_seconds * 1000]);
    }
  }
  if (!due.length) return null;
  const [kind, at] = due.reduce((a, b) => (b[1] < a[1] ? b : a));
  return { at, what: DEADLINE_WHAT[kind] };
}

function approvalBadge(task) {
  const approval = waitingApprovalOf(task.id);
  const yours = approval !== undefined && mayAnswer(approval);
  const b = el("span", yours ? "badge awaiting-approval needs-you" : "badge awaiting-approval",
    yours ? "needs you" : "waiting for approval");
  b.title = approval ? `${approval.asked_by} asks: ${approval.question}` : "an agent asked a person a question";
  return b;
}

// A card is kept small (a few elements): 10,000 of them must build and lay out quickly. The
// two elements that tick are kept on the card: card.inStageEl ("3m in RUNNING") and
// card.leaseEl (the lease's countdown, RUNNING only).
function fillCard(card, task, filter) {
  card.dataset.stage = task.stage;
  card.dataset.version = task.version;
  card.hidden = filter ? !matches(task, filter) : false;
  const head = el("div", "card-head");
  // The id on a line of its own (an id of 40 characters wraps there, not into the priority and
  // queue); the admin link sits at the end of the meta line, out of the id's way.
  head.append(el("b", "card-id", task.id), `P${task.priority} · ${task.queue}`);
  // A fairness key (a plan, a person): its tasks take turns with other keys' in the claim order.
  if (task.fairness_key) head.append(" · ", el("span", "fairness-key", task.fairness_key));
  // Its tags (search: tag:NAME), as small chips after the queue.
  for (const tag of task.tags || []) head.append(" ", el("span", "tag", tag));
  const meta = el("div", "card-meta");
  // Fence and version are in the details panel: the card says who, how often, how long.
  card.inStageEl = el("span", "in-stage");
  card.inStageText = "";
  // A COMPLETED card names who ran it (its holder is gone with the lease; `ran_by` is read from its
  // history by the server, as are the run's and the wait's lengths below).
  const ranBy = task.stage === "COMPLETED" && task.ran_by;
  const owner = el("span", ranBy ? "owner ran-by" : "owner", ranBy || task.owner || "—");
  if (ranBy) owner.title = `ran by ${ranBy}`;
  meta.append(owner, ` · attempts ${task.attempts}/${task.max_retries + 1} · `, card.inStageEl);
  updateInStage(card, task, Date.now());
  card.leaseEl = null;
  if (task.stage === "RUNNING" && task.leaseExpiresMs !== null) {
    card.leaseEl = el("span", "lease");
    meta.append(" ", card.leaseEl);
  }
  meta.append(adminLink(task.id));
  const parts = [head, el("div", "card-title", task.title), meta];
  const ran = task.stage === "COMPLETED" ? runText(task) : "";
  if (ran) parts.push(el("div", "card-run", ran));
  const progress = task.progress !== null && task.progress !== undefined;
  const held = task.on_hold && task.stage === "PENDING";
  // Why a ready task is not claimed: its queue is paused, at its limit or waiting for its rate,
  // or its concurrency key is full, or its rate key's slow rate holds it back (the "queues" frame;
  // store.js redraws these cards when that changes).
  const queued = task.stage === "QUEUED";
  const closed = queued ? queueClosed(task.queue) : undefined;
  const keyHeld = queued && task.concurrency_key ? keyFull(task.concurrency_key) : undefined;
  const rateHeld = queued && task.rate_key ? rateKeyHeld(task.rate_key) : undefined;
  // ... or its fairness key's budget is spent (issue 32, item 5), in whatever queue it waits.
  const keySpent = queued && task.fairness_key ? fairnessKeySpent(task.fairness_key) : undefined;
  // ... or one of its resources is held by another task (issue 32: the frame's resources).
  const resourceHeld = queued && task.resources ? resourceWait(task) : undefined;
  // ... or it needs capabilities of its claimer (issue 32, item 3): "needs gpu, python"; when
  // check() finds that no agent key used in the last hour holds them all, it says so plainly
  // (the problems frame; a change of it redraws the cards it names, startRendering).
  const needs = queued && task.requires?.length ? requiresText(task.requires) : "";
  const unclaimable = needs ? unclaimableWhy(task.id) : undefined;
  const paused = closed !== undefined || keyHeld !== undefined || rateHeld !== undefined || keySpent !== undefined
    || resourceHeld !== undefined;
  // A RUNNING task holds its resources (its claim took them all): "holds NAME", all in its title.
  const holds = task.stage === "RUNNING" && task.resources?.length ? resourcesText(task.resources) : "";
  // ... or it may not start yet: a run_at, a snooze or a retry's backoff (its not_before, as
  // drawn; the card is not redrawn when that time passes, so the badge names the time).
  const notBefore = task.stage === "QUEUED" && task.not_before ? Date.parse(task.not_before) : NaN;
  const later = notBefore > Date.now();
  // ... and when one of its deadlines runs out (issue 29, item 7), named as a time like the above.
  const deadline = deadlineOf(task);
  const { error, attempt } = troubleBadges(task);
  // ... or it never will: check() found it stranded behind a cancelled or failed dependency
  // (the problems frame; a change of it redraws the cards it names, startRendering).
  const stranded = strandedWhy(task.id);
  card.classList.toggle("stranded", Boolean(stranded));
  // ... or an agent asked a person a question and waits for the answer (approval gates): "needs
  // you" when this user may answer it (the Needs-you lane has its form), else "waiting for approval".
  const asked = task.stage === "PAUSED" && task.awaiting_approval;
  if (error || attempt || held || progress || paused || later || deadline || stranded || holds || asked || needs) {
    const badges = el("div", "badges");
    if (asked) badges.append(approvalBadge(task));
    if (stranded) {
      const b = el("span", "badge bad stranded", "stranded: can never run");
      b.title = stranded;
      badges.append(b);
    }
    if (closed) badges.append(el("span", "badge waiting", `waiting: ${closed}`));
    if (keyHeld) badges.append(el("span", "badge waiting key-full", `waiting: ${keyHeld}`));
    if (rateHeld) badges.append(el("span", "badge waiting rate-key", `waiting: ${rateHeld}`));
    if (keySpent) badges.append(el("span", "badge waiting budget-spent", `waiting: ${keySpent}`));
    if (resourceHeld) {
      const b = el("span", "badge waiting resource-held", `waiting: ${resourceHeld.text}`);
      b.title = resourceHeld.why;
      badges.append(b);
    }
    if (needs) {
      const them = task.requires.length === 1 ? "it" : "them";
      const b = unclaimable
        ? el("span", "badge waiting unclaimable", `needs ${needs}: no agent with ${them} seen in the last hour`)
        : el("span", "badge needs-capabilities", `needs ${needs}`);
      b.title = unclaimable || `only an agent whose key holds ${needs} claims it`;
      badges.append(b);
    }
    if (holds) {
      const names = task.resources.map((r) => (typeof r === "string" ? r : r.name));
      const short = names.join(", ");
      const shown = short.length <= 32 ? short : `${names.length} resources`;
      const b = el("span", "badge holds-resources", `holds ${shown}`);
      b.title = `holds ${holds}`;
      badges.append(b);
    }
    if (later) {
      const b = el("span", "badge waiting not-before", `not before ${new Date(notBefore).toLocaleTimeString()}`);
      b.title = new Date(notBefore).toLocaleString();
      badges.append(b);
    }
    if (deadline) {
      const b = el("span", "badge deadline", `deadline ${new Date(deadline.at).toLocaleTimeString()}`);
      b.title = `${deadline.what} ${new Date(deadline.at).toLocaleString()}`;
      badges.append(b);
    }
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
      const li = depDead(dep) ? el("li", "dep dead", `✗ ${dep}`)
        : el("li", done ? "dep done" : done === false ? "dep todo" : "dep unknown", `${done ? "✓" : done === false ? "…" : "?"} ${dep}`);
      li.dataset.dep = dep;
      deps.append(li);
    }
    parts.push(deps);
  }
  card.replaceChildren(...parts);
  card.classList.remove("lease-expired");
  if (card.leaseEl) updateLease(card, task, Date.now());
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
  const text = `${formatAge(now - task.inStageSinceMs)} in ${task.stage}`;
  if (text === card.inStageText) return;
  card.inStageText = text;
  setText(card.inStageEl, text);
}

function tickStages() {
  const now = Date.now();
  for (const [id, card] of cards) {
    const task = getTask(id);
    if (task && card.inStageEl) updateInStage(card, task, now);
  }
}

// The countdown to each lease's expiry, ticking once a second on the client's clock; past
// zero it turns into a red badge.
function updateLease(card, task, now) {
  const lease = card.leaseEl;
  if (!lease) return;
  const left = task.leaseExpiresMs - now;
  const expired = left <= 0;
  setText(lease, expired ? `lease expired ${formatDuration(-left)} ago` : `lease ${formatDuration(left)}`);
  if (expired !== card.classList.contains("lease-expired")) {
    lease.className = expired ? "lease badge bad" : "lease";
    card.classList.toggle("lease-expired", expired);
  }
}

function tickLeases() {
  const now = Date.now();
  for (const id of idsIn("RUNNING") || []) {
    const card = cards.get(id);
    if (card) updateLease(card, getTask(id), now);
  }
}

// ------------------------------------------------------------------------------------------
// Problems

function renderProblems() {
  const problems = getProblems();
  const panel = document.getElementById("problems");
  const checked = problemsChecked();
  const count = panel.querySelector("h2 .count");
  count.textContent = checked ? problems.length : "…";
  count.title = checked ? "" : "the server is running its first check of the board";
  panel.classList.toggle("checking", !checked);
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

/** Show the card a problem names (clearing the filters that hide it). */
function highlight(id) {
  if (highlighted) cards.get(highlighted)?.classList.remove("highlight");
  highlighted = id;
  if (hollowOf.has(id)) fillChunk(hollowOf.get(id));
  const card = cards.get(id);
  if (!card) {
    showMessage(`task ${id} is not on the board (finished long ago, or unknown)`, "error");
    return;
  }
  if (card.hidden || card.closest(".column").hidden) clearFilters();
  card.classList.add("highlight");
  card.scrollIntoView({ block: "center", inline: "nearest" });
}

// ------------------------------------------------------------------------------------------

/** The filters changed: hide the cards that do not match, count again. */
function applyFilter() {
  const f = currentFilter();
  for (const [id, card] of cards) card.hidden = f ? !matches(getTask(id), f) : false;
  for (const chunk of new Set(hollowOf.values())) sizeHollow(chunk);
  renderCounts();
}

/** Redraw what the model and the view announce, tick the clocks, and wire the problems panel
 * and each column's "show more" (its next page from the server: clicked, or scrolled to). */
export function startRendering() {
  subscribe((change) => {
    if (change.what === "snapshot") {
      cardProblems = cardProblemsNow();
      renderAll();
    } else if (change.what === "tasks") {
      for (const id of change.ids) dirty.add(id);
      if (change.counts) countsDirty = true;
      scheduleFrame();
    } else if (change.what === "problems") {
      renderProblems();
      // Cards that became stranded or unclaimable, or stopped being (a requeued dependency, an
      // agent with the capabilities seen): drawn again.
      const now = cardProblemsNow();
      for (const id of new Set([...cardProblems.keys(), ...now.keys()])) {
        if (cardProblems.get(id) !== now.get(id)) markDirty(id);
      }
      cardProblems = now;
    } else if (change.what === "approvals") {
      // The approvals were read: the cards that wait for an answer say whether it is this user's.
      for (const task of allTasks()) if (task.awaiting_approval) markDirty(task.id);
    }
  });
  subscribeView((change) => {
    if (change.what === "filters") applyFilter();
  });
  document.querySelector("#no-match .clear-filter").addEventListener("click", () => clearFilters());
  setInterval(tickStages, 1000);
  setInterval(tickLeases, 1000);
  // Also when nothing changed: the window was resized, or the live board shows again.
  setInterval(loadWhereShort, 1000);

  const list = document.querySelector("#problems ul");
  list.addEventListener("click", (e) => {
    const li = e.target.closest("li.problem");
    if (li) highlight(li.dataset.task);
  });
  list.addEventListener("keydown", (e) => {
    const li = e.target.closest("li.problem");
    if (li && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); highlight(li.dataset.task); }
  });

  for (const stage of STAGES) watchChunks(cardsOf(stage));
  for (const stage of STAGES) {
    const button = COLUMN_ELS.get(stage)?.querySelector(".show-more");
    if (!button) continue;
    button.addEventListener("click", async () => {
      if (button.disabled) return;
      button.disabled = true;
      try {
        // Its tasks and cursor land in the model: redrawn from there.
        if (currentMatches()) await loadMoreMatching(stage);
        else await loadMore(stage);
      } catch (err) {
        showMessage(`could not load more ${stage} tasks: ${err.message || err}`, "error");
        return; // no retry loop: the button stays for a click
      } finally {
        button.disabled = false;
      }
      requestAnimationFrame(() => loadIfNearEnd(stage)); // the page added little: on to the next
    });
    cardsOf(stage).addEventListener("scroll", () => loadIfNearEnd(stage), { passive: true });
  }
}

// A column's next page loads when its cards are scrolled to within SCROLL_AHEAD_PX of their end
// (or its window no longer fills it: claims took its first cards), as if its "show more" was
// clicked; the button stays for a keyboard or a click.
const SCROLL_AHEAD_PX = 600;

function loadIfNearEnd(stage) {
  const button = COLUMN_ELS.get(stage).querySelector(".show-more");
  const list = cardsOf(stage);
  // Not drawn (a stage filter hides it, or the board at a past moment is shown): its size says nothing.
  if (button.hidden || button.disabled || !list.offsetParent) return;
  if (list.scrollTop + list.clientHeight >= list.scrollHeight - SCROLL_AHEAD_PX) button.click();
}
