// A WebSocket that reconnects (with backoff) unless the server refused us on purpose.
// Shared by the runs list and the run page. Plain JS, no build step.
// handlers: onMessage(msg); optional onOpen() on every open, onReopen() on an open after
// one had closed, onDown() on every close the page will retry (the channel layer down,
// the web process restarting): a page that must keep up polls meanwhile.
"use strict";

window.Rollway = window.Rollway || {};

// Close codes the server uses to refuse a client (runs/consumers.py): do not retry.
Rollway.REFUSED = { 4401: "not logged in", 4403: "not a member of this run's team" };

Rollway.openSocket = function (path, handlers) {
  var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
  var url = scheme + window.location.host + path;
  var stateEl = document.getElementById("live-state");
  var delay = 1000;
  var everOpened = false;

  function setState(state, text) {
    // A finished run's page says it is final, whatever its socket does after.
    if (!stateEl || stateEl.dataset.state === "final") return;
    stateEl.dataset.state = state;
    stateEl.textContent = text;
  }

  function connect() {
    var socket = new WebSocket(url);
    socket.onopen = function () {
      delay = 1000;
      setState("live", "live");
      if (handlers.onOpen) handlers.onOpen();
      if (everOpened && handlers.onReopen) handlers.onReopen();
      everOpened = true;
    };
    socket.onmessage = function (event) {
      handlers.onMessage(JSON.parse(event.data));
    };
    socket.onclose = function (event) {
      if (Rollway.REFUSED[event.code]) {
        setState("refused", "live updates refused: " + Rollway.REFUSED[event.code]);
        return;
      }
      setState("reconnecting", "reconnecting…");
      if (handlers.onDown) handlers.onDown();
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }
  connect();
};

Rollway.setStatus = function (container, run) {
  // Update a status badge (class status-<status>) inside `container`.
  var badge = container.querySelector("[data-role=status]");
  if (!badge) return;
  badge.textContent = run.status;
  badge.className = "status status-" + run.status;
  // A queued run's place in the queue and what it waits for (runs/queue.py).
  var queue = container.querySelector("[data-role=queue]");
  if (!queue && run.status === "queued") {
    queue = document.createElement("span");
    queue.className = "queue-info";
    queue.setAttribute("data-role", "queue");
    badge.insertAdjacentElement("afterend", queue);
  }
  if (queue) {
    queue.hidden = run.status !== "queued";
    queue.textContent = run.status !== "queued" ? "" :
      (run.queue_position ? "#" + run.queue_position + " in queue · " : "") + (run.waiting_for || "");
    queue.title = run.waiting_for || "";
  }
};
