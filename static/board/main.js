// The live board's entry point (templates/board/board.html loads it as a module; native ES
// modules, no build step). It only wires the modules together. Data flows one way:
//
//   socket.js, api.js  ->  store.js  ->  render.js, details.js, view.js, insights.js, queues.js,
//                                       headers.js
//
//   page.js      what the page hands the scripts (stages, moves, rights, URLs), DOM helpers
//   store.js     the model: tasks, versions, column order, counts, dependencies, problems,
//                insights, queues; no DOM, no network; fed by socket.js and api.js, read by the rest,
//                and it tells its listeners what changed (subscribe)
//   socket.js    the websocket protocol: snapshot parts, change frames, gaps, closes (its
//                header describes the frames as the server sends them)
//   api.js       every HTTP request of the page: what must land (a fetched task, older
//                finished tasks, a dependency's stage) lands in the model; actions are only sent
//   view.js      filters and the open task, kept in the URL (render.js and details.js follow it)
//   render.js    cards, columns, counts, "show more", the problems panel
//   actions.js   the operator's buttons, drag and drop, the cancel dialog: they call the API,
//                and the socket brings the result back
//   timeline.js  a task's history rows, heartbeats collapsed (details.js, attempts.js, taskpage.js)
//   taskfields.js  a task's fields (details.js, taskpage.js)
//   attempts.js  the attempt timeline (details.js shows it)
//   details.js   the details panel of one task (full task, history, attempt timeline)
//   insights.js  the agents and throughput panel
//   limits.js    the queue limits dialog: concurrency limit and rate (queues.js opens it)
//   queues.js    the queues strip: running/limit, depth, rate, pauses; Pause/Resume, Limits
//   headers.js   under the QUEUED and RUNNING headers: the queues held back, the limits' use
//   bulk.js      "Act on all N matching…": one action on every task the filter matches, its
//                count first, then the job's progress (the socket's "bulk" frames), Stop, summary
//   approvalform.js  an approval's words and its answer form, drawn from its JSON Schema
//                (approvals.js, taskpage.js)
//   approvals.js the "Needs you" lane: the approvals waiting for an answer, read again when a
//                card's awaiting_approval changes; browser notifications of new ones
//   moment.js    the time control: the board at a past moment (GET /api/board?at= through api.js),
//                drawn read-only in its own columns; Live shows the live board again
//
// taskpage.js is the other entry point: a task's own page (/board/task/<id>), drawn with
// taskfields.js, attempts.js and timeline.js from api.js, as the details panel is.
//
// A module imports only modules above it in that list, so never in a circle (a module below
// learns of a change by subscribing: store.subscribe, view.subscribeView, actions.onActed): tests/test_js_modules.py checks it, and that only api.js fetches, only socket.js
// opens a socket, and only they write the model.
//
// What a test, the benchmark or a person may read of the page is its documented state in the
// DOM (socket.js's header lists it); there are no globals. No module runs anything of another
// at load time: everything starts here, once every module has loaded.

import { startApi } from "./api.js";
import { startApprovals } from "./approvals.js";
import { startBulk } from "./bulk.js";
import { startDragAndDrop } from "./actions.js";
import { startDetails } from "./details.js";
import { startHeaders } from "./headers.js";
import { startInsights } from "./insights.js";
import { startMoment } from "./moment.js";
import { startQueues } from "./queues.js";
import { startRendering } from "./render.js";
import { startSocket } from "./socket.js";
import { restoreView, startView } from "./view.js";

startApi();
startRendering();
startDetails();
startDragAndDrop();
startView();
startInsights();
startQueues();
startHeaders();
startBulk();
startApprovals();
startMoment(); // the time control; a ?at= link shows that moment (the live board starts underneath all the same)
restoreView(); // the filters and the open task from the URL (the task opens with the first snapshot)
startSocket();
