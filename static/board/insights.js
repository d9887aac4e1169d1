// The agents and throughput panel of the board's aside (<section id="insights">), fed only by
// the board's websocket: socket.js puts each {"type": "insights", ...} frame (board/live/insights.py,
// pushed by the server's tailer) in the model, and this panel redraws from it. It never polls the API. Charts are inline SVG
// bars, one per minute of the last hour. The section's data-updates, data-completed and
// data-failed say what it shows.

import { el } from "./page.js";
import { getInsights, subscribe } from "./store.js";

const STYLE = `
#insights { padding: 10px; border-bottom: 1px solid var(--line, #d9dce1); }
#insights h3 { font-size: 13px; margin: 8px 0 2px; }
#insights table { width: 100%; border-collapse: collapse; font-size: 12px; }
#insights th, #insights td { text-align: left; padding: 2px 4px; border-bottom: 1px solid var(--line, #d9dce1); vertical-align: top; }
#insights td.num, #insights th.num { text-align: right; }
#insights .holds { overflow-wrap: anywhere; }
#insights .chart { display: block; width: 100%; height: 48px; }
#insights .chart .completed { fill: var(--ok, #2e7d32); }
#insights .chart .failed { fill: var(--bad, #c62828); }
#insights .chart .depth { fill: var(--accent, #1565c0); }
#insights .chart .axis { stroke: var(--line, #d9dce1); }
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

function minuteLabel(data, i) {
  return new Date(Date.parse(data.start) + i * 60000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

/** Bars per minute: `series` is a list of [className, values]; stacked from the bottom. */
function barChart(data, series, label) {
  const minutes = data.minutes;
  const height = 40;
  const totals = Array.from({ length: minutes }, (_, i) => sum(series.map(([, values]) => values[i] || 0)));
  const top = Math.max(1, ...totals);
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${minutes * 4} ${height + 1}`, preserveAspectRatio: "none", role: "img" });
  chart.setAttribute("aria-label", label);
  chart.append(svg("line", { class: "axis", x1: 0, y1: height + 0.5, x2: minutes * 4, y2: height + 0.5 }));
  for (let i = 0; i < minutes; i++) {
    let base = height;
    for (const [cls, values] of series) {
      const value = values[i] || 0;
      if (!value) continue;
      const h = (value / top) * height;
      base -= h;
      const bar = svg("rect", { class: cls, x: i * 4 + 0.5, y: base, width: 3, height: h });
      const title = svg("title");
      title.textContent = `${minuteLabel(data, i)}: ${value} ${cls}`;
      bar.append(title);
      chart.append(bar);
    }
  }
  return chart;
}

function agentsTable(data) {
  if (!data.agents.length) return el("p", "empty", "No agent in the last hour.");
  const table = el("table", "agents");
  const head = el("tr");
  for (const [name, cls] of [["agent"], ["holds"], ["heartbeat"], ["done", "num"], ["failed", "num"]]) head.append(el("th", cls, name));
  const thead = el("thead");
  thead.append(head);
  table.append(thead);
  const body = el("tbody");
  for (const agent of data.agents) {
    const row = el("tr");
    row.dataset.agent = agent.name;
    const more = agent.holding > agent.holds.length ? ` +${agent.holding - agent.holds.length}` : "";
    row.append(
      el("td", "name", agent.name),
      el("td", "holds", agent.holds.join(", ") + more || "—"),
      el("td", "heartbeat", ago(agent.last_heartbeat, data.now)),
      el("td", "num completed", String(agent.completed)),
      el("td", "num failed", String(agent.failed)),
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

  const parts = [el("h2", null, "Agents and throughput")];
  parts.push(el("h3", null, "Agents"), agentsTable(data));
  if (data.more_agents) parts.push(el("p", "legend", `and ${data.more_agents} more agents`));

  parts.push(el("h3", null, "Completions and failures per minute"));
  const throughput = barChart(data, [["completed", data.throughput.completed], ["failed", data.throughput.failed]],
    "completions and failures per minute over the last hour");
  throughput.classList.add("throughput");
  parts.push(throughput, el("p", "legend", `last hour: ${completed} completed, ${failed} failed`));

  parts.push(el("h3", null, "Queue depth"));
  // Each bar is the most a minute held; "now" is the depth at this moment (queued_now).
  const now = (queue, depths) => (data.queued_now || {})[queue] ?? depths[depths.length - 1];
  const queues = Object.entries(data.queue_depth)
    .sort((a, b) => now(b[0], b[1]) - now(a[0], a[1]) || a[0].localeCompare(b[0]));
  if (!queues.length) parts.push(el("p", "empty", "No queue has had ready tasks in the last hour."));
  for (const [queue, depths] of queues.slice(0, MAX_QUEUES)) {
    const chart = barChart(data, [["depth", depths]], `most tasks queued in ${queue} per minute over the last hour`);
    chart.dataset.queue = queue;
    chart.dataset.depth = String(now(queue, depths));
    parts.push(el("p", "legend", `${queue}: ${now(queue, depths)} queued now, at most ${Math.max(...depths)}`), chart);
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
}
