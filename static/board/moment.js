// The board at any moment (issue 33, item 4; docs/board.md, "The board at any moment"; the server's side:
// docs/board-at.md). The time control above the columns: a slider over the kept history (from the oldest
// moment the board can be rebuilt exactly at, the page's data-history-from, to now), a date-time field, a
// step one event back or forward, playback at 1×, 10× or 60×, and Live. A past moment is asked of the
// server (GET /api/board?at=, through api.js) and drawn here, read-only, in its own columns
// (#moment-columns) and problems panel (#moment-problems), under a banner "Board as it was at …". The
// live board is not touched: its socket stays open and its model current underneath (hidden by
// body[data-moment]), so Live shows it again at once. The moment is kept in the URL (?at=ISO time): a
// link to /board/?at=2026-12-04T10:15:00Z opens there.
//
// What a test or a person may read: section#time-control with data-mode ("live" or "past"), input#time-at,
// #time-slider, buttons #time-back, #time-forward, #time-play, #time-live; body[data-moment] (the ISO time
// shown); p#moment-banner (data-exact "true"/"false"); #moment-columns .moment-column[data-stage] with .count
// and article.card[data-id][data-version] (data-owner); #moment-problems li[data-code]; each drawn
// answer sets #moment-columns's data-drawn to its moment.

import { el, showMessage } from "./page.js";
import { loadBoardAt } from "./api.js";

const control = document.getElementById("time-control");
const slider = document.getElementById("time-slider");
const field = document.getElementById("time-at");
const backButton = document.getElementById("time-back");
const forwardButton = document.getElementById("time-forward");
const playButton = document.getElementById("time-play");
const speedSelect = document.getElementById("time-speed");
const liveButton = document.getElementById("time-live");
const banner = document.getElementById("moment-banner");
const pastColumns = document.getElementById("moment-columns");
const pastProblems = document.getElementById("moment-problems");

const PLAY_TICK_MS = 250; // playback moves the moment this often (by TICK x speed)
const ASK_AFTER_MS = 150; // a slider dragged asks once it rests this long
let moment = null; // ms since the epoch of the moment shown; null: live
let momentText = null; // the moment as sent (an event's own time keeps its microseconds)
let last = null; // the last answer drawn
let asking = 0; // the latest request: only its answer is drawn
let inFlight = false;
let pending = false; // a moment asked for while a request was out
let playTimer = null;
let sliderTimer = null;

const historyFrom = () => {
  const text = control.dataset.historyFrom;
  const t = text ? Date.parse(text) : NaN;
  return Number.isFinite(t) ? t : Date.now() - 3600 * 1000;
};

/** ISO 8601 in UTC, to the millisecond, with Z (the API's and the URL's form). */
const iso = (ms) => new Date(ms).toISOString();

/** The value of a datetime-local field for `ms`, in the browser's time zone, to the second. */
function localValue(ms) {
  const d = new Date(ms);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function setRange() {
  const from = Math.min(historyFrom(), moment ?? Infinity);
  slider.min = String(Math.floor(from / 1000));
  slider.max = String(Math.ceil(Date.now() / 1000));
}

function writeUrl() {
  const params = new URLSearchParams(location.search);
  if (moment === null) params.delete("at");
  else params.set("at", momentText);
  const query = params.toString();
  history.replaceState(null, "", location.pathname + (query ? `?${query}` : "") + location.hash);
}

/** Show the board at `ms` (clamped to now), or at `exact` (an ISO time the server gave: an event's). */
function goTo(ms, exact = null) {
  const now = Date.now();
  if (ms >= now) { ms = now - 1000; exact = null; } // the server knows the board up to its clock
  moment = Math.floor(ms);
  momentText = exact || iso(moment);
  control.dataset.mode = "past";
  liveButton.setAttribute("aria-pressed", "false");
  document.body.dataset.moment = momentText;
  setRange();
  slider.value = String(Math.floor(moment / 1000));
  field.value = localValue(moment);
  writeUrl();
  ask();
}

async function ask() {
  if (inFlight) { pending = true; return; }
  inFlight = true;
  const mine = ++asking;
  const at = momentText;
  try {
    const answer = await loadBoardAt(at);
    if (mine === asking && moment !== null && momentText === at) draw(answer);
  } catch (error) {
    showMessage(`Could not show the board at ${at}: ${error.message}`, "error");
    stopPlaying();
  } finally {
    inFlight = false;
    if (pending && moment !== null) { pending = false; ask(); }
  }
}

function draw(answer) {
  last = answer;
  const shownAt = new Date(answer.at);
  banner.hidden = false;
  banner.dataset.exact = String(answer.exact);
  const time = banner.querySelector("time");
  time.dateTime = answer.at;
  time.textContent = `${shownAt.toLocaleString()} (${answer.at.replace("+00:00", "Z")})`;
  const inexact = banner.querySelector(".moment-inexact");
  inexact.hidden = answer.exact;
  inexact.textContent = answer.exact ? "" :
    `— not exact: finished tasks deleted by the history's retention may be missing (exact from ${new Date(answer.exact_from).toLocaleString()})`;
  const more = banner.querySelector(".moment-more");
  const total = Object.values(answer.counts).reduce((a, b) => a + b, 0);
  more.hidden = !answer.next;
  more.textContent = answer.next ? `(the first ${answer.tasks.length} of ${total} tasks by id are shown; the counts are the whole board's)` : "";
  const byStage = new Map();
  for (const task of answer.tasks) {
    if (!byStage.has(task.stage)) byStage.set(task.stage, []);
    byStage.get(task.stage).push(task);
  }
  for (const column of pastColumns.querySelectorAll(".moment-column")) {
    const stage = column.dataset.stage;
    column.querySelector(".count").textContent = String(answer.counts[stage] ?? 0);
    const cards = column.querySelector(".cards");
    cards.replaceChildren(...(byStage.get(stage) || []).map(card));
  }
  const problems = answer.problems || [];
  pastProblems.querySelector(".count").textContent = String(problems.length);
  pastProblems.querySelector("ul").replaceChildren(...problems.map((p) => {
    const li = el("li", "problem", p.text);
    li.dataset.code = p.code;
    li.dataset.task = p.task;
    return li;
  }));
  pastProblems.hidden = false;
  pastColumns.hidden = false;
  pastColumns.dataset.drawn = answer.at;
  backButton.disabled = !answer.previous_event_at;
  forwardButton.disabled = !answer.next_event_at;
}

function card(task) {
  const article = el("article", "card");
  article.dataset.id = task.id;
  article.dataset.version = String(task.version);
  if (task.owner) article.dataset.owner = task.owner;
  const head = el("div", "card-head");
  head.append(el("span", "card-id", task.id));
  article.append(head, el("div", "card-meta", `v${task.version}${task.owner ? ` · ${task.owner}` : ""}`));
  return article;
}

function goLive() {
  stopPlaying();
  moment = null;
  momentText = null;
  asking++;
  control.dataset.mode = "live";
  liveButton.setAttribute("aria-pressed", "true");
  delete document.body.dataset.moment;
  banner.hidden = true;
  pastColumns.hidden = true;
  pastProblems.hidden = true;
  // Nothing of the past is left in the page: the live board's cards are the only .card[data-id] then.
  for (const cards of pastColumns.querySelectorAll(".cards")) cards.replaceChildren();
  pastProblems.querySelector("ul").replaceChildren();
  delete pastColumns.dataset.drawn;
  setRange();
  slider.value = slider.max;
  field.value = "";
  writeUrl();
}

function stopPlaying() {
  if (playTimer !== null) clearInterval(playTimer);
  playTimer = null;
  playButton.setAttribute("aria-pressed", "false");
  playButton.textContent = "Play";
}

function play() {
  if (playTimer !== null) { stopPlaying(); return; }
  if (moment === null) goTo(historyFrom());
  playButton.setAttribute("aria-pressed", "true");
  playButton.textContent = "Pause";
  playTimer = setInterval(() => {
    const next = moment + PLAY_TICK_MS * Number(speedSelect.value);
    if (next >= Date.now()) { goLive(); return; }
    goTo(next);
  }, PLAY_TICK_MS);
}

export function startMoment() {
  setRange();
  slider.value = slider.max;
  slider.addEventListener("input", () => {
    clearTimeout(sliderTimer);
    const ms = Number(slider.value) * 1000;
    field.value = localValue(ms);
    sliderTimer = setTimeout(() => goTo(ms), ASK_AFTER_MS);
  });
  field.addEventListener("change", () => {
    const ms = Date.parse(field.value); // a datetime-local value: the browser's time zone
    if (Number.isFinite(ms)) goTo(ms);
  });
  backButton.addEventListener("click", () => {
    stopPlaying();
    if (moment === null) goTo(Date.now());
    else if (last?.previous_event_at) goTo(Date.parse(last.previous_event_at), last.previous_event_at);
  });
  forwardButton.addEventListener("click", () => {
    stopPlaying();
    if (last?.next_event_at && moment !== null) goTo(Date.parse(last.next_event_at), last.next_event_at);
  });
  playButton.addEventListener("click", play);
  liveButton.addEventListener("click", goLive);
  const fromUrl = new URLSearchParams(location.search).get("at");
  if (fromUrl) {
    const ms = Date.parse(fromUrl);
    if (Number.isFinite(ms)) goTo(ms, fromUrl);
    else showMessage(`The link's moment ${fromUrl} is not a time: showing the live board`, "error");
  }
}
