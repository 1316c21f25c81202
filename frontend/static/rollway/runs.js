// Runs list: status and phase changes arrive over /ws/runs/ and update rows in place;
// a run launched elsewhere (another tab, the API) appears at the top of the unfiltered
// first page. Filters, sort and page live in the URL (the server renders them); this
// script adds selection (Compare, Cancel selected) and formats durations.
"use strict";

(function () {
  var table = document.getElementById("runs");
  var tbody = table.querySelector("tbody");
  var compare = document.getElementById("compare-selected");
  var cancelButton = document.getElementById("cancel-selected");
  var count = document.getElementById("selected-count");
  var selectAll = document.getElementById("select-all");
  var unfiltered = !window.location.search;

  Rollway.formatSeconds = Rollway.formatSeconds || function (s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  };

  function formatCells(row) {
    var d = row.querySelector("[data-duration-s]");
    if (d) d.textContent = d.dataset.durationS === "" ? "—" : Rollway.formatSeconds(Number(d.dataset.durationS));
    var eta = row.querySelector("[data-role=eta]");
    if (eta && eta.dataset.etaS !== "") eta.textContent = "~" + Rollway.formatSeconds(Number(eta.dataset.etaS)) + " left";
  }

  function selected() {
    return Array.prototype.map.call(
      tbody.querySelectorAll("input[name=runs]:checked"), function (box) { return box.value; });
  }

  function onSelection() {
    var ids = selected();
    count.textContent = ids.length + " selected";
    cancelButton.disabled = ids.length === 0;
    // The compare page takes ?runs=1,2,3; comparing needs two runs at least.
    compare.href = "/compare/?runs=" + ids.join(",");
    compare.setAttribute("aria-disabled", ids.length < 2 ? "true" : "false");
  }

  compare.addEventListener("click", function (event) {
    if (compare.getAttribute("aria-disabled") === "true") event.preventDefault();
  });
  tbody.addEventListener("change", onSelection);
  selectAll.addEventListener("change", function () {
    tbody.querySelectorAll("input[name=runs]").forEach(function (box) { box.checked = selectAll.checked; });
    onSelection();
  });

  function cell(text, child) {
    var td = document.createElement("td");
    if (child) td.appendChild(child); else td.textContent = text;
    return td;
  }

  function newRow(run) {
    var tr = document.createElement("tr");
    tr.dataset.runId = run.id;
    var box = document.createElement("input");
    box.type = "checkbox";
    box.name = "runs";
    box.value = run.id;
    var link = document.createElement("a");
    link.href = run.url;
    link.textContent = run.name;
    var status = document.createElement("td");
    status.className = "status-cell";
    var badge = document.createElement("span");
    badge.dataset.role = "status";
    var phase = document.createElement("span");
    phase.className = "phase";
    phase.dataset.role = "phase";
    status.appendChild(badge);
    status.appendChild(document.createTextNode(" "));
    status.appendChild(phase);
    tr.appendChild(cell(null, box));
    tr.appendChild(cell(String(run.id)));
    var name = cell(null, link);
    if (run.simulated) {
      var mark = document.createElement("span");
      mark.className = "simulated-mark";
      mark.title = "Ran on the simulator's cost models, not on GPUs";
      mark.textContent = "simulated";
      name.appendChild(document.createTextNode(" "));
      name.appendChild(mark);
    }
    tr.appendChild(name);
    tr.appendChild(cell(run.team.name + " / " + run.experiment.name));
    tr.appendChild(cell(run.preset));
    tr.appendChild(status);
    ["—", "—", "—", "—"].forEach(function (t) { tr.appendChild(cell(t)); });
    tr.appendChild(cell(run.created_at ? run.created_at.replace("T", " ").slice(0, 19) : ""));
    return tr;
  }

  function update(run) {
    var row = tbody.querySelector('tr[data-run-id="' + run.id + '"]');
    if (!row) {
      if (!unfiltered) return;  // a filtered or later page: the next load decides
      var empty = tbody.querySelector("tr.empty");
      if (empty) empty.remove();
      row = newRow(run);
      tbody.insertBefore(row, tbody.firstChild);
    }
    Rollway.setStatus(row, run);
    var phase = row.querySelector("[data-role=phase]");
    if (phase) {
      phase.textContent = run.phase || "";
      phase.hidden = run.status !== "running" || !run.phase;
    }
  }

  tbody.querySelectorAll("tr[data-run-id]").forEach(formatCells);
  onSelection();

  // Without a shared channel layer (no REDIS_URL) changes made by the Celery worker
  // never reach the socket: refresh unfinished rows from the API, as a fallback.
  var POLL_MS = 10000;
  (function poll() {
    setTimeout(function () {
      var unfinished = tbody.querySelector(
        "[data-role=status]:not(.status-succeeded):not(.status-failed):not(.status-cancelled)");
      if (!unfinished) return poll();
      fetch(table.dataset.apiUrl + window.location.search, { credentials: "same-origin" })
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
