// Runs list: status changes arrive over /ws/runs/ and update rows in place;
// a run launched elsewhere (another tab, the API) appears at the top.
"use strict";

(function () {
  var table = document.getElementById("runs");
  var tbody = table.querySelector("tbody");

  function cell(text, child) {
    var td = document.createElement("td");
    if (child) td.appendChild(child); else td.textContent = text;
    return td;
  }

  function newRow(run) {
    var tr = document.createElement("tr");
    tr.dataset.runId = run.id;
    var link = document.createElement("a");
    link.href = run.url;
    link.textContent = run.name;
    var badge = document.createElement("span");
    badge.dataset.role = "status";
    tr.appendChild(cell(String(run.id)));
    tr.appendChild(cell(null, link));
    tr.appendChild(cell(run.team.name + " / " + run.experiment.name));
    tr.appendChild(cell(run.preset));
    tr.appendChild(cell(null, badge));
    tr.appendChild(cell(run.created_at ? run.created_at.replace("T", " ").slice(0, 19) : ""));
    return tr;
  }

  function update(run) {
    var row = tbody.querySelector('tr[data-run-id="' + run.id + '"]');
    if (!row) {
      var empty = tbody.querySelector("tr.empty");
      if (empty) empty.remove();
      row = newRow(run);
      tbody.insertBefore(row, tbody.firstChild);
    }
    Rollway.setStatus(row, run);
  }

  // Without a shared channel layer (no REDIS_URL) changes made by the Celery worker
  // never reach the socket: refresh unfinished rows from the API, as a fallback.
  var POLL_MS = 10000;
  (function poll() {
    setTimeout(function () {
      var unfinished = tbody.querySelector(
        "[data-role=status]:not(.status-succeeded):not(.status-failed):not(.status-cancelled)");
      if (!unfinished) return poll();
      fetch(table.dataset.apiUrl, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : { runs: [] }; })
        .then(function (body) {
          body.runs.forEach(function (run) {
            if (tbody.querySelector('tr[data-run-id="' + run.id + '"]')) update(run);
          });
        })
        .finally(poll);
    }, POLL_MS);
  })();

  Rollway.openSocket(table.dataset.livePath, {
    onMessage: function (msg) {
      if (msg.type === "status") update(msg.run);
    },
    // After a reconnect we may have missed changes: the page itself is the catch-up.
    onReopen: function () { window.location.reload(); },
  });
})();
