// The queue limits dialog (<dialog id="limits-dialog">): a user with board.change_queue sets a
// queue's concurrency limit, its rate and its budget (tokens and/or cost per day, month or in
// total) from the queues strip (queues.js opens it and sends the
// answer as PUT /api/queues/{name}). An empty number is "none". The browser's own checks keep a
// limit or count a whole number from 1 up; the server has the last word (its 422 is shown).

import { rateText } from "./page.js";

const dialog = document.getElementById("limits-dialog");
const form = dialog.querySelector("form");
const UNITS = new Set(["1", "60", "3600"]);

function wholeOrNull(input) {
  return input.value.trim() === "" ? null : Number(input.value);
}

/** Show the rate's window in the unit list, adding it when it is not a second, minute or hour
 * (set over the API: "per 90 s"), so that saving the dialog keeps it. */
function chooseUnit(select, perSeconds) {
  for (const option of [...select.options]) if (!UNITS.has(option.value)) option.remove();
  const value = String(perSeconds);
  if (!UNITS.has(value)) {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = `${value} s`;
    select.append(option);
  }
  select.value = value;
}

/** Ask for queue `q`'s limits (q as the "queues" frame has it): resolves to {concurrency, rate,
 * budget, reason} as PUT /api/queues/{name} takes them when saved, null when dismissed. With
 * `budgetOnly` (a fairness key, as the frame has it) the dialog shows its budget alone. */
export function askLimits(q, { budgetOnly = false } = {}) {
  dialog.querySelector(".limits-what").textContent = budgetOnly ? "Budget of fairness key" : "Limits of queue";
  dialog.querySelector(".queue-name").textContent = q.name;
  for (const part of dialog.querySelectorAll(".queue-only")) part.hidden = budgetOnly;
  form.elements.limit.value = budgetOnly || q.concurrency === null ? "" : String(q.concurrency);
  form.elements["rate-count"].value = q.rate ? String(q.rate.count) : "";
  chooseUnit(form.elements["rate-unit"], q.rate ? q.rate.per_seconds : 60);
  form.elements["rate-count"].title = q.rate ? `now ${rateText(q.rate)}` : "no rate now";
  form.elements["budget-tokens"].value = q.budget && q.budget.tokens !== null ? String(q.budget.tokens) : "";
  form.elements["budget-cost"].value = q.budget && q.budget.cost_usd !== null ? String(q.budget.cost_usd) : "";
  form.elements["budget-per"].value = q.budget ? q.budget.per : "day";
  form.elements.reason.value = "";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue !== "confirm") {
        resolve(null);
        return;
      }
      const count = wholeOrNull(form.elements["rate-count"]);
      const tokens = wholeOrNull(form.elements["budget-tokens"]);
      const cost = wholeOrNull(form.elements["budget-cost"]);
      resolve({
        concurrency: wholeOrNull(form.elements.limit),
        rate: count === null ? null : { count, per_seconds: Number(form.elements["rate-unit"].value) },
        budget: tokens === null && cost === null ? null
          : { tokens, cost_usd: cost, per: form.elements["budget-per"].value },
        reason: form.elements.reason.value.trim(),
      });
    }, { once: true });
    dialog.showModal();
    (budgetOnly ? form.elements["budget-tokens"] : form.elements.limit).focus();
  });
}
