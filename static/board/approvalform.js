// An approval (issue 32, approval gates: board.engine.approvals) as the board shows it, and its
// answer form: the Needs-you lane (approvals.js) and a task's own page (taskpage.js) draw them
// with these.
//
// The form is drawn from the approval's `form`, a JSON Schema of flat fields: a string is a text
// box (a select with an `enum`), a number or an integer a number box, a boolean a checkbox;
// `title` labels a field, `description` explains it, `default` fills it, `required` marks it
// (and the browser asks for it before Approve). A comment, then Approve and Reject: both POST
// /api/tasks/{id}/answer with the approval's id (api.js sendAnswer); the server judges who may
// answer, checks the values against the form (on Approve) and answers one person only (of two
// answers at once, the second is refused "already answered"): the form says the outcome in
// words. A user who is not an approver of the question (page.mayAnswer, the engine's rule) sees
// the form with its buttons disabled, and why in their title.
//
// What a test or a person may read: form.approval-form[data-approval][data-task], its fields
// [data-field=NAME] (.required when required), textarea[name=comment], button.approve and
// button.reject, and p.approval-status (data-outcome: approved, rejected, refused, or the
// error's code) with the words.

import { el, mayAnswer } from "./page.js";
import { sendAnswer } from "./api.js";

const TIMEOUT_WORDS = {
  fail: "the task fails",
  approve: "it is approved by itself",
  cancel: "the task is cancelled",
};

const STATE_WORDS = {
  waiting: "waiting for an answer",
  approved: "approved",
  rejected: "rejected",
  timed_out: "timed out (the task failed)",
  cancelled: "cancelled (with its task)",
};

/** "14:05:03" today, else the date and time, in the browser's locale. */
export function whenText(iso) {
  if (!iso) return "—";
  const at = new Date(iso);
  return at.toDateString() === new Date().toDateString() ? at.toLocaleTimeString() : at.toLocaleString();
}

/** "asked by worker-1 at 14:05:03 (attempt 1)" */
export function askedText(approval) {
  return `asked by ${approval.asked_by} at ${whenText(approval.asked_at)} (attempt ${approval.attempt})`;
}

/** "unanswered by 15:05:03, the task fails", or "" when it has no timeout. */
export function dueText(approval) {
  if (!approval.due_at) return "";
  return `unanswered by ${whenText(approval.due_at)}, ${TIMEOUT_WORDS[approval.on_timeout] || approval.on_timeout}`;
}

/** "approvers: alice, reviewers" or "approvers: operators". */
export function approversText(approval) {
  return `approvers: ${(approval.approvers || []).join(", ") || "operators"}`;
}

export function stateText(approval) {
  return STATE_WORDS[approval.state] || approval.state;
}

function fieldRow(name, spec, required) {
  const row = el("div", `approval-field${required ? " required" : ""}`);
  row.dataset.field = name;
  const label = el("label");
  const text = el("span", "field-label", spec.title || name);
  if (required) {
    const star = el("abbr", "required-mark", "*");
    star.title = "required";
    text.append(" ", star);
  }
  let input;
  if (spec.type === "boolean") {
    input = el("input");
    input.type = "checkbox";
    input.checked = spec.default === true;
    label.classList.add("checkbox");
    label.append(input, " ", text);
  } else if (Array.isArray(spec.enum)) {
    input = el("select");
    // Not required and no default: "no value" is a choice too.
    if (!required || spec.default === undefined) input.append(new Option(required ? "choose…" : "—", ""));
    for (const value of spec.enum) input.append(new Option(String(value), JSON.stringify(value)));
    if (spec.default !== undefined) input.value = JSON.stringify(spec.default);
    label.append(text, input);
  } else {
    input = el("input");
    if (spec.type === "number" || spec.type === "integer") {
      input.type = "number";
      input.step = spec.type === "integer" ? "1" : "any";
      if (typeof spec.minimum === "number") input.min = String(spec.minimum);
      if (typeof spec.maximum === "number") input.max = String(spec.maximum);
    } else {
      input.type = "text";
      if (typeof spec.minLength === "number") input.minLength = spec.minLength;
      if (typeof spec.maxLength === "number") input.maxLength = spec.maxLength;
      if (typeof spec.pattern === "string") input.pattern = spec.pattern;
    }
    if (spec.default !== undefined && spec.default !== null) input.value = String(spec.default);
    label.append(text, input);
  }
  input.name = `field-${name}`;
  if (required && spec.type !== "boolean") input.required = true; // a boolean is always sent
  row.append(label);
  if (spec.description) row.append(el("small", "field-hint", spec.description));
  return { row, input };
}

/** The values the form's fields hold, typed as the form says; an empty box sends nothing. */
function valuesOf(fields) {
  const values = {};
  for (const [name, { spec, input }] of fields) {
    if (spec.type === "boolean") {
      values[name] = input.checked;
    } else if (input.value !== "") {
      if (input.tagName === "SELECT") values[name] = JSON.parse(input.value);
      else values[name] = spec.type === "number" || spec.type === "integer" ? Number(input.value) : input.value;
    }
  }
  return values;
}

/** A refused answer in words (the server's own, named). */
export function refusalWords(sent) {
  const error = sent.body && sent.body.error;
  const message = (error && error.message) || (sent.status ? `HTTP ${sent.status}` : "no answer from the server");
  const code = error && error.code;
  if (code === "already_answered") {
    // "approval 5 was already answered by alice at 2026-12-05T14:05:03+00:00 (approved)", or
    // "approval 5 timed out", "... was cancelled with its task".
    const local = message.replace(/\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:\d\d|Z)?/, (iso) => whenText(iso));
    const by = local.match(/was already answered by (.*)$/);
    return by ? `Already answered by ${by[1]}.` : `No longer waiting: ${local}.`;
  }
  if (code === "forbidden") return `You are not an approver of this question (${message}).`;
  if (code === "validation_error") return `The answer does not fit the form: ${message}`;
  return `Not answered: ${message}`;
}

/** The answer form of waiting `approval`. `onAnswered(outcome)` is called once the server
 * answered: outcome "approved" or "rejected", or "already_answered" when someone answered first
 * (the approval waits no more either way). */
export function answerForm(approval, { onAnswered = () => {} } = {}) {
  const form = el("form", "approval-form");
  form.dataset.approval = String(approval.id);
  form.dataset.task = approval.task;
  const properties = (approval.form && approval.form.properties) || {};
  const required = new Set((approval.form && approval.form.required) || []);
  const fields = new Map();
  for (const [name, spec] of Object.entries(properties)) {
    const { row, input } = fieldRow(name, spec, required.has(name));
    fields.set(name, { spec, input });
    form.append(row);
  }
  const comment = el("textarea");
  comment.name = "comment";
  comment.rows = 2;
  comment.maxLength = 2000; // MAX_QUESTION_CHARS (board/engine/limits.py)
  comment.placeholder = "optional: words for the agent";
  const commentLabel = el("label", "approval-comment");
  commentLabel.append(el("span", "field-label", "Comment"), comment);
  form.append(commentLabel);
  const approve = el("button", "approve", "Approve");
  approve.type = "submit";
  const reject = el("button", "reject", "Reject");
  reject.type = "button";
  const buttons = el("div", "approval-buttons");
  buttons.append(approve, reject);
  const status = el("p", "approval-status");
  status.setAttribute("role", "status");
  status.hidden = true;
  form.append(buttons, status);

  const allowed = mayAnswer(approval);
  if (!allowed) {
    const why = `you are not an approver of this question (${approversText(approval)})`;
    for (const b of [approve, reject]) {
      b.disabled = true;
      b.title = why;
    }
    form.dataset.mayAnswer = "false";
    status.hidden = false;
    status.textContent = `Only its approvers answer: ${why}.`;
  }

  const say = (outcome, words) => {
    status.hidden = false;
    status.dataset.outcome = outcome;
    status.textContent = words;
  };

  async function send(approved) {
    approve.disabled = reject.disabled = true;
    form.setAttribute("aria-busy", "true");
    const fields_ = { approve: approved, comment: comment.value.trim(), approval_id: approval.id };
    const values = valuesOf(fields);
    if (approval.form && Object.keys(values).length) fields_.values = values;
    const sent = await sendAnswer(approval.task, fields_);
    form.removeAttribute("aria-busy");
    if (sent.ok) {
      const stage = sent.body && sent.body.task ? sent.body.task.stage : "QUEUED";
      const verdict = approved ? "Approved" : "Rejected";
      say(approved ? "approved" : "rejected",
        `${verdict}: task ${approval.task} is ${stage} again, kept a minute for ${approval.asked_by}.`);
      onAnswered(approved ? "approved" : "rejected", status.textContent);
      return;
    }
    const code = (sent.body && sent.body.error && sent.body.error.code) || "refused";
    say(code, refusalWords(sent));
    if (code === "already_answered") {
      onAnswered(code, status.textContent);
      return; // nothing left to answer
    }
    approve.disabled = reject.disabled = false;
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (allowed) send(true);
  });
  // Reject needs no valid values (the server checks them on an approval only).
  reject.addEventListener("click", () => { if (allowed) send(false); });
  return form;
}

/** What an answered approval says: "approved by alice at 14:05:03" (or timed out, cancelled),
 * with its values and comment, as a list of nodes. */
export function answeredParts(approval) {
  const parts = [];
  const who = approval.answered_by ? ` by ${approval.answered_by}` : "";
  const when = approval.answered_at ? ` at ${whenText(approval.answered_at)}` : "";
  parts.push(el("p", `approval-answer state-${approval.state}`, `${stateText(approval)}${who}${when}`));
  if (approval.values && Object.keys(approval.values).length) {
    const dl = el("dl", "approval-values");
    for (const [name, value] of Object.entries(approval.values)) {
      const title = approval.form && approval.form.properties && approval.form.properties[name]
        && approval.form.properties[name].title;
      const text = typeof value === "string" ? value : JSON.stringify(value);
      dl.append(el("dt", null, title || name), el("dd", null, text));
    }
    parts.push(dl);
  }
  if (approval.comment) parts.push(el("q", "approval-comment-text", approval.comment));
  return parts;
}
