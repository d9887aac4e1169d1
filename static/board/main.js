// The live board's entry point (templates/board/board.html loads it as a module; native ES
// modules, no build step). It only wires the modules together:
//
//   page.js      what the page hands the scripts (stages, moves, rights, URLs), DOM helpers
//   store.js     the model: tasks, versions, column order, counts, dependencies, problems
//   socket.js    the websocket protocol: snapshot parts, change frames, gaps, closes (its
//                header describes the frames as the server sends them)
//   render.js    cards, columns, counts, "show more", the problems panel
//   view.js      filters and the open task, kept in the URL
//   details.js   the details panel of one task (full task, history, attempt timeline)
//   actions.js   the operator's buttons, drag and drop, the cancel dialog
//   attempts.js  the attempt timeline;  insights.js  the agents and throughput panel
//
// What a test, the benchmark or a person may read of the page is its documented state in the
// DOM (socket.js's header lists it); there are no globals.
//
// Modules import each other's functions freely (render.js and view.js call each other, for
// instance); none runs anything of another at load time: everything starts here, once every
// module has loaded.

import { startDragAndDrop } from "./actions.js";
import { startDetails } from "./details.js";
import { startRendering } from "./render.js";
import { startSocket } from "./socket.js";
import { restoreView, startView } from "./view.js";

startRendering();
startDetails();
startDragAndDrop();
startView();
restoreView(); // the filters and the open task from the URL (the task opens with the first snapshot)
startSocket();
