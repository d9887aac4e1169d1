// The agents and throughput panel of the board's aside (<section id="insights">), fed only by
// the board's websocket: socket.js puts each {"type": "insights", ...} frame (board/live/insights.py,
// pushed by the server's tailer) in the model, and this panel redraws from it. It never polls the API.
//
// Charts are inline SVG drawn at the panel's own pixel size (redrawn when the window resizes), so
// that their text is not stretched: bars per slot of the last hour (a slot is one minute, or
// several when the panel is too narrow for bars MIN_SLOT_PX wide), a y axis with a few round
// ticks, an x axis with times, and the latest slot's value printed at the right. Every queue's
// depth chart shares one scale (a queue holding 2 is drawn 2/786 as tall as one holding 786; a
// value above 0 is at least 1 px tall, so that it shows). The section's data-updates,
// data-completed and data-failed say what it shows; each chart's data-top its scale's top.

import { el } from "./page.js";
import { getInsights, subscribe } from "./store.js";

const STYLE = `
#insights { padding: 10px; border-bottom: 1px solid var(--line, #d9dce1); }
#insights h3 { font-size: 13px; margin: 8px 0 2px; }
#insights table { width: 100%; border-collapse: collapse; font-size: 12px; }
#insights th, #insights td { text-align: left; padding: 2px 4px; border-bottom: 1px solid var(--line, #d9dce1); vertical-align: top; }
#insights td.num, #insights th.num { text-align: right; }
#insights table.agents { table-layout: fixed; }
#insights table.agents th:nth-child(1) { width: 25%; }
#insights table.agents th:nth-child(2) { width: 20%; }
#insights table.agents th:nth-child(3) { width: 19%; }
#insights table.agents th:nth-child(6) { width: 20%; }
#insights table.agents td, #insights table.agents th { overflow: hidden; text-overflow: ellipsis; }
#insights .held-id, #insights .agent-name { display: block; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
#insights .chart { display: block; margin: 2px 0 6px; overflow: visible; }
#insights .chart .completed { fill: var(--ok, #2e7d32); }
#insights .chart .failed { fill: var(--bad, #c62828); }
#insights .chart .depth { fill: var(--accent, #1565c0); }
#insights .chart .axis { stroke: var(--muted, #6b7280); stroke-width: 1; }
#insights .chart .grid { stroke: var(--line, #d9dce1); stroke-width: 1; stroke-dasharray: 2 3; }
#insights .chart .tick { fill: var(--muted, #6b7280); font-size: 10px; font-variant-numeric: tabular-nums; }
#insights .chart .latest { fill: var(--text, #1f2328); font-size: 11px; font-weight: 600; font-variant-numeric: tabular-nums; }
#insights table.timing th.group { text-align: center; }
#insights table.timing td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
#insights .legend, #insights .empty { color: var(--muted, #6b7280); font-size: 12px; margin: 0; }
`;
const style = document.createElement("style");
style.textContent = STYLE;
document.head.append(style);

const SVG = "http://www.w3.org/2000/svg";
const MAX_QUEUES = 6; // charts shown; the deepest queues first
let updates = 0;

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

function sum(values) { return values.reduce((a, b) => a + b, 0); }

function ago(fromIso, nowIso) {
  if (!fromIso) return "over an hour ago";
  const s = Math.max(0, Math.round((Date.parse(nowIso) - Date.parse(fromIso)) / 1000));
  if (s < 60) return `${s} s ago`;
  return `${Math.floor(s / 60)} min ago`;
}

function timeLabel(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
}

const MIN_SLOT_PX = 7; // the narrowest slot (bar and gap) a chart draws; minutes are grouped to fit
const MARGIN = { left: 30, right: 34, top: 8, bottom: 15 };

/** The round top of a scale holding `most` (a count), and its ticks from 0: at most 4 steps of 1,
 * 2, 2.5 or 5 times a power of ten, whole numbers only. */
function niceScale(most) {
  const target = Math.max(1, Math.ceil(most));
  const rough = target / 4;
  let step = 1;
  if (rough > 1) {
    const power = 10 ** Math.floor(Math.log10(rough));
    step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((c) => c >= rough && Number.isInteger(c));
  }
  const top = Math.ceil(target / step) * step;
  const ticks = [];
  for (let v = 0; v <= top; v += step) ticks.push(v);
  return { top, ticks };
}

function short(value) {
  if (value >= 10000) return `${Math.round(value / 1000)}k`;
  if (value >= 1000) return `${(value / 1000).toFixed(1).replace(/\.0$/, "")}k`;
  return String(value);
}

/** Each series' minutes grouped into slots of `per` minutes (the last slot holds the current minute):
 * `combine` makes a slot's value from its minutes' (a sum for counts, the most for depths). */
function slots(values, per, combine) {
  const out = [];
  for (let end = values.length; end > 0; end -= per) out.unshift(combine(values.slice(Math.max(0, end - per), end)));
  return out;
}

function layout(section) {
  const width = Math.max(220, Math.floor((section.clientWidth || 300) - 20));
  const plot = width - MARGIN.left - MARGIN.right;
  return { width, plot };
}

/** Bars per slot: `series` is a list of [className, values per slot]; stacked from the bottom,
 * on the scale `scale` (niceScale). `start`: the first slot's time (ms), `per`: minutes a slot. */
function barChart({ width, plot }, height, series, scale, label, start, per, unit) {
  const n = series[0][1].length;
  const slotPx = plot / n;
  const barPx = Math.max(2, slotPx - Math.max(1, Math.round(slotPx * 0.2)));
  const chart = svg("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  chart.setAttribute("aria-label", label);
  chart.dataset.top = String(scale.top);
  chart.dataset.slotMinutes = String(per);
  const inner = height - MARGIN.top - MARGIN.bottom;
  const y = (v) => MARGIN.top + inner - (v / scale.top) * inner;
  // A grid line at every tick; a label at every tick, or every other when they would crowd.
  const every = Math.ceil(13 / (inner / Math.max(1, scale.ticks.length - 1)));
  scale.ticks.forEach((tick, i) => {
    const at = y(tick);
    chart.append(svg("line", { class: tick ? "grid" : "axis", x1: MARGIN.left, x2: MARGIN.left + plot, y1: at, y2: at }));
    if (i % every) return;
    const text = svg("text", { class: "tick y", x: MARGIN.left - 4, y: at + 3, "text-anchor": "end" });
    text.textContent = short(tick);
    chart.append(text);
  });
  // The x axis: a time at every quarter hour the slots cross, and "now" at the end.
  const slotMs = per * 60000;
  const end = start + n * slotMs;
  const quarter = 15 * 60000;
  // A time's label (about 30 px wide, centred) keeps clear of "now" (about 22 px, at the end).
  const lastLabelX = MARGIN.left + plot - 40;
  for (let t = Math.ceil(start / quarter) * quarter; t < end; t += quarter) {
    const x = MARGIN.left + ((t - start) / slotMs) * slotPx;
    if (x > lastLabelX) break;
    chart.append(svg("line", { class: "axis", x1: x, x2: x, y1: MARGIN.top + inner, y2: MARGIN.top + inner + 3 }));
    const text = svg("text", { class: "tick x", x, y: height - 3, "text-anchor": "middle" });
    text.textContent = timeLabel(t);
    chart.append(text);
  }
  const nowText = svg("text", { class: "tick x", x: MARGIN.left + plot, y: height - 3, "text-anchor": "end" });
  nowText.textContent = "now";
  chart.append(nowText);

  for (let i = 0; i < n; i++) {
    let base = MARGIN.top + inner;
    for (const [cls, values] of series) {
      const value = values[i];
      if (!value) continue;
      const h = Math.max(1, (value / scale.top) * inner);
      base -= h;
      const bar = svg("rect", { class: cls, x: MARGIN.left + i * slotPx + (slotPx - barPx) / 2, y: base, width: barPx, height: h });
      const title = svg("title");
      const from = start + i * slotMs;
      title.textContent = `${timeLabel(from)}${per > 1 ? `–${timeLabel(from + slotMs)}` : ""}: ${value} ${cls}${unit}`;
      bar.append(title);
      chart.append(bar);
    }
  }
  // The latest slot's value, printed at the right of its bar.
  const latest = series.reduce((total, [, values]) => total + values[n - 1], 0);
  const text = svg("text", { class: "latest", x: MARGIN.left + plot + 4, y: Math.min(y(latest) + 4, MARGIN.top + inner), "text-anchor": "start" });
  text.textContent = short(latest);
  chart.append(text);
  return chart;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m ${String(Math.round(seconds % 60)).padStart(2, "0")}s`;
  return `${Math.floor(minutes / 60)}h ${String(minutes % 60).padStart(2, "0")}m`;
}

/** Per queue: the last hour's waits (ready to claimed) and runs (claim to complete or fail). */
function timingTable(timing) {
  const queues = Object.keys(timing || {});
  if (!queues.length) return el("p", "empty", "No task was claimed or finished in the last hour.");
  const table = el("table", "timing");
  const thead = el("thead");
  const groups = el("tr");
  const waitTh = el("th", "group", "wait");
  waitTh.colSpan = 2;
  waitTh.title = "from ready (queued, past any backoff) to claimed";
  const runTh = el("th", "group", "run");
  runTh.colSpan = 2;
  runTh.title = "from the claim to the complete or fail";
  groups.append(el("th", null, ""), waitTh, runTh);
  const head = el("tr");
  for (const [name, title] of [["queue"], ["p50", "the median"], ["p95", "95% took this long or less"],
    ["p50", "the median"], ["p95", "95% took this long or less"]]) {
    const th = el("th", title ? "num" : null, name);
    if (title) th.title = title;
    head.append(th);
  }
  thead.append(groups, head);
  table.append(thead);
  const body = el("tbody");
  for (const queue of queues) {
    const { wait, run } = timing[queue];
    const row = el("tr");
    row.dataset.queue = queue;
    row.append(el("td", "name", queue),
      el("td", "num wait-p50", duration(wait.p50)), el("td", "num wait-p95", duration(wait.p95)),
      el("td", "num run-p50", duration(run.p50)), el("td", "num run-p95", duration(run.p95)));
    row.title = `${wait.count} waits and ${run.count} runs ended in the last hour`;
    body.append(row);
  }
  table.append(body);
  return table;
}

/** An agent's reported usage: its tokens, compact (12.3k), the detail and the cost in the title;
 * "—" when it reported none (missing, not zero). */
function usageCell(used) {
  const cell = el("td", "num usage", "—");
  if (!used) {
    cell.title = "no usage reported in the last hour";
    return cell;
  }
  const tokens = used.input_tokens + used.output_tokens;
  cell.textContent = tokens >= 10000 ? `${(tokens / 1000).toFixed(tokens >= 100000 ? 0 : 1)}k` : String(tokens);
  const cost = used.cost_usd !== null ? `$${used.cost_usd.toFixed(2)}` : `cost not reported (${used.cost_missing} reports)`;
  cell.title = `${used.input_tokens.toLocaleString()} in + ${used.output_tokens.toLocaleString()} out tokens · ${cost}`;
  return cell;
}

function agentsTable(data) {
  if (!data.agents.length) return el("p", "empty", "No agent in the last hour.");
  const table = el("table", "agents");
  const head = el("tr");
  // "seen": its last heartbeat (a claim, renew or finish); ✓ and ✗: its completions and failures.
  // "used": the tokens it reported using in the hour (input + output; the cost in the title).
  for (const [name, cls, title] of [["agent"], ["holds"], ["seen", "", "last heartbeat"],
    ["✓", "num", "completed in the last hour"], ["✗", "num", "failed in the last hour"],
    ["used", "num", "tokens it reported using in the last hour"]]) {
    const th = el("th", cls, name);
    if (title) th.title = title;
    head.append(th);
  }
  const thead = el("thead");
  thead.append(head);
  table.append(thead);
  const body = el("tbody");
  for (const agent of data.agents) {
    const row = el("tr");
    row.dataset.agent = agent.name;
    // One id a line, cut with an ellipsis (the full id in its title): long ids wrapped a letter
    // a line in the panel's narrow column.
    const holds = el("td", "holds");
    for (const id of agent.holds) {
      const held = el("span", "held-id", id);
      held.title = id;
      holds.append(held);
    }
    if (agent.holding > agent.holds.length) holds.append(el("span", "held-more", `+${agent.holding - agent.holds.length}`));
    if (!agent.holds.length) holds.textContent = "—";
    const name = el("td", "name");
    name.append(el("span", "agent-name", agent.name));
    name.title = agent.name;
    row.append(
      name,
      holds,
      el("td", "heartbeat", ago(agent.last_heartbeat, data.now)),
      el("td", "num completed", String(agent.completed)),
      el("td", "num failed", String(agent.failed)),
      usageCell(agent.usage),
    );
    if (agent.last_heartbeat) row.cells[2].title = new Date(agent.last_heartbeat).toLocaleString();
    body.append(row);
  }
  table.append(body);
  return table;
}

function render() {
  const section = document.getElementById("insights");
  const data = getInsights();
  if (!section || !data) return;
  const completed = sum(data.throughput.completed);
  const failed = sum(data.throughput.failed);
  section.dataset.updates = String(updates);
  section.dataset.completed = String(completed);
  section.dataset.failed = String(failed);

  const size = layout(section);
  const per = Math.max(1, Math.ceil((data.minutes * MIN_SLOT_PX) / size.plot));
  // The first slot's start: the slots end with the current minute, and the first may be partial.
  const count = Math.ceil(data.minutes / per);
  const start = Date.parse(data.start) + (data.minutes - count * per) * 60000;
  const most = (values) => Math.max(0, ...values);

  const parts = [el("h2", null, "Agents and throughput")];
  parts.push(el("h3", null, "Agents"), agentsTable(data));
  if (data.more_agents) parts.push(el("p", "legend", `and ${data.more_agents} more agents`));

  parts.push(el("h3", null, per > 1 ? `Completions and failures per ${per} minutes` : "Completions and failures per minute"));
  const done = slots(data.throughput.completed, per, sum);
  const bad = slots(data.throughput.failed, per, sum);
  const throughput = barChart(size, 80, [["completed", done], ["failed", bad]],
    niceScale(Math.max(0, ...done.map((v, i) => v + bad[i]))),
    "completions and failures over the last hour", start, per, "");
  throughput.classList.add("throughput");
  parts.push(throughput, el("p", "legend", `last hour: ${completed} completed, ${failed} failed`));

  parts.push(el("h3", null, "Wait and run times, last hour"), timingTable(data.timing));

  parts.push(el("h3", null, "Queue depth, one scale"));
  // Each bar is the most a slot held; "now" is the depth at this moment (queued_now).
  const now = (queue, depths) => (data.queued_now || {})[queue] ?? depths[depths.length - 1];
  const queues = Object.entries(data.queue_depth)
    .sort((a, b) => now(b[0], b[1]) - now(a[0], a[1]) || a[0].localeCompare(b[0]));
  if (!queues.length) parts.push(el("p", "empty", "No queue has had ready tasks in the last hour."));
  const shown = queues.slice(0, MAX_QUEUES).map(([queue, depths]) => [queue, depths, slots(depths, per, most)]);
  const shared = niceScale(Math.max(0, ...shown.map(([, , grouped]) => most(grouped))));
  for (const [queue, depths, grouped] of shown) {
    const chart = barChart(size, 60, [["depth", grouped]], shared,
      `most tasks queued in ${queue} over the last hour`, start, per, " queued");
    chart.dataset.queue = queue;
    chart.dataset.depth = String(now(queue, depths));
    parts.push(el("p", "legend", `${queue}: ${now(queue, depths)} queued now, at most ${most(depths)}`), chart);
  }
  const moreQueues = Math.max(0, queues.length - MAX_QUEUES) + (data.more_queues || 0);
  if (moreQueues) parts.push(el("p", "legend", `and ${moreQueues} more queues`));
  section.replaceChildren(...parts);
}

/** Redraw on each frame of figures the model receives. */
export function startInsights() {
  subscribe((change) => {
    if (change.what !== "insights") return;
    updates += 1;
    render();
  });
  // The charts are drawn at the panel's pixel width: again when it changes.
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(render, 100);
  });
}
