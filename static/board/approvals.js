// The "Needs you" lane above the board (<section id="needs-you">): every approval waiting for an
// answer (issue 32, approval gates), oldest first, each with its task (a link to the task's page),
// the question, who asked and when, its timeout, and its answer form (approvalform.js). Hidden
// when nothing waits.
//
// Live: the cards carry `awaiting_approval` and `approvals_count` (board/live/reads.py); when a
// snapshot with a card awaiting an answer comes, or a card's pair changes (an agent asked,
// someone answered, a timeout or a cancel closed it), the lane reads GET /api/approvals?state=waiting again (api.js
// loadApprovals, landed in the model) and redraws: an approval already shown keeps its element,
// so a half-filled form survives another approval's arrival.
//
// Browser notifications: the "Notify me" button (#notify-me in the top bar) asks for the
// permission; once granted, each approval this page had not seen before shows a notification
// ("TaskFlow: approval needed", the question as its body). The approvals of the first read are
// seen, not news.
//
// What a test or a person may read: #needs-you[data-count][data-updates] (the approvals drawn,
// how many reads were drawn), its li.approval[data-approval][data-task] items, #notify-me
// [data-permission] (default, granted, denied, unsupported).

import { el, showMessage, taskPageUrl } from "./page.js";
import { allTasks, getApprovals, getTask, subscribe } from "./store.js";
import { loadApprovals, noApprovalsWaiting } from "./api.js";
import { answerForm, approversText, askedText, dueText } from "./approvalform.js";

const section = document.getElementById("needs-you");
const list = section.querySelector("ul");
const notifyButton = document.getElementById("notify-me");
const items = new Map(); // approval id -> its <li>
const seen = new Set(); // approval ids this page has shown (each is news once)
const awaiting = new Map(); // task id -> approvals_count, for the cards that await an answer
let loaded = false; // the first read came (its approvals are not news)
let updates = 0;
let reading = false;
let readAgain = false;

/** Read the waiting approvals again (one read at a time; a change meanwhile asks for one more). */
async function reread() {
  if (reading) {
    readAgain = true;
    return;
  }
  reading = true;
  try {
    await loadApprovals();
  } catch (err) {
    showMessage(`could not read the approvals waiting for an answer: ${err.message || err}`, "error");
  } finally {
    reading = false;
    if (readAgain) {
      readAgain = false;
      reread();
    }
  }
}

function item(approval) {
  const li = el("li", "approval");
  li.dataset.approval = String(approval.id);
  li.dataset.task = approval.task;
  const head = el("div", "approval-head");
  const link = el("a", "approval-task", approval.task);
  link.href = taskPageUrl(approval.task);
  link.title = `task ${approval.task}'s page`;
  const task = getTask(approval.task);
  head.append(link);
  if (task) head.append(" ", el("span", "approval-title", task.title));
  const question = el("p", "approval-question", approval.question);
  const meta = el("p", "approval-meta", askedText(approval));
  const due = dueText(approval);
  if (due) meta.append(" · ", el("span", "approval-due", due));
  meta.append(" · ", el("span", "approval-approvers", approversText(approval)));
  li.append(head, question, meta, answerForm(approval, {
    onAnswered: (outcome, words) => {
      showMessage(`${approval.task}: ${words}`, outcome === "already_answered" ? "error" : "info");
      reread();
    },
  }));
  return li;
}

function render() {
  const approvals = getApprovals();
  const ids = new Set(approvals.map((a) => a.id));
  for (const [id, li] of items) {
    if (!ids.has(id)) {
      li.remove();
      items.delete(id);
    }
  }
  let previous = null;
  for (const approval of approvals) {
    let li = items.get(approval.id);
    if (!li) items.set(approval.id, (li = item(approval)));
    if (previous ? previous.nextElementSibling !== li : list.firstElementChild !== li) {
      if (previous) previous.after(li);
      else list.prepend(li);
    }
    previous = li;
  }
  section.hidden = approvals.length === 0;
  section.querySelector("h2 .count").textContent = String(approvals.length);
  section.dataset.count = String(approvals.length);
  section.dataset.updates = String(++updates);
  for (const approval of approvals) {
    if (seen.has(approval.id)) continue;
    seen.add(approval.id);
    if (loaded) notify(approval);
  }
  loaded = true;
}

// ------------------------------------------------------------------------------------------
// Browser notifications

function permission() {
  return "Notification" in window ? Notification.permission : "unsupported";
}

function showPermission() {
  const state = permission();
  notifyButton.dataset.permission = state;
  notifyButton.hidden = state === "unsupported";
  notifyButton.disabled = state !== "default";
  notifyButton.textContent = { granted: "Notifications on", denied: "Notifications blocked" }[state] || "Notify me";
  notifyButton.title = {
    granted: "this page notifies you of each new approval while it is open",
    denied: "the browser blocks this site's notifications: allow them in its site settings",
  }[state] || "get a browser notification when an agent asks for an approval (while this page is open)";
}

function notify(approval) {
  if (permission() !== "granted") return;
  try {
    const note = new Notification("TaskFlow: approval needed", {
      body: approval.question,
      tag: `approval-${approval.id}`,
    });
    note.onclick = () => {
      window.focus();
      items.get(approval.id)?.scrollIntoView({ block: "center" });
    };
  } catch {
    // A browser that only notifies from a service worker (Chrome on Android): the lane shows it.
  }
}

// ------------------------------------------------------------------------------------------

function awaitingOf(task) {
  return task && task.awaiting_approval ? task.approvals_count : undefined;
}

/** Follow the cards' awaiting_approval (read again when it changes), draw each read. */
export function startApprovals() {
  subscribe((change) => {
    if (change.what === "approvals") {
      render();
    } else if (change.what === "snapshot") {
      awaiting.clear();
      for (const task of allTasks()) if (task.awaiting_approval) awaiting.set(task.id, task.approvals_count);
      // A snapshot holds every unfinished task: with none awaiting an answer there is nothing to
      // read (a board without approvals makes no request for them; its other panels neither).
      if (awaiting.size) reread();
      else noApprovalsWaiting();
    } else if (change.what === "tasks") {
      let flipped = false;
      for (const id of change.ids) {
        const now = awaitingOf(getTask(id));
        if (now === awaiting.get(id)) continue;
        flipped = true;
        if (now === undefined) awaiting.delete(id);
        else awaiting.set(id, now);
      }
      if (flipped) reread();
    }
  });
  showPermission();
  notifyButton.addEventListener("click", async () => {
    if (permission() !== "default") return;
    try {
      await Notification.requestPermission();
    } finally {
      showPermission();
    }
  });
}
