// Run page: draw each chart from the metrics API, then append live points from
// /ws/runs/<id>/ with Plotly.extendTraces: no reload, no full redraw.
//
// Points are (series, step, value, time); x is the trainer step, shared by every
// series. lastStep[series] makes appends idempotent: a point re-sent by the engine's
// spool, or one already in the API answer, is never drawn twice.
//
// A trace never holds more than twice the points the API's downsampled read gives a
// series (its max_points): once one reaches that, its chart is read again, the whole run
// downsampled, so a tab left open on a long run keeps its memory bounded and still
// shows the run from its first step.
//
// Zooming in (a drag on the chart) reads the steps in view again at the API's full
// resolution for that range (from_step/to_step); zooming out (a double click) reads the
// whole run again, downsampled.
"use strict";

(function () {
  var root = document.getElementById("run");
  var metricsUrl = root.dataset.metricsUrl;
  var charts = [];          // {div, series: [name, ...], drawn: bool}
  var traceOf = {};         // series name -> {chart, index}
  var lastStep = {};        // series name -> highest step drawn
  var pending = [];         // points to draw: before the charts are, and during catch-ups
  var drawn = false;
  var flushTimer = null;
  var catchingUp = 0;       // catch-ups in flight: live points wait for their answers

  var palette = ["#2563eb", "#dc2626", "#059669", "#d97706"];
  // A new object each time: Plotly writes into the layout it is given (an axis's range),
  // so charts sharing one would take each other's ranges.
  function chartLayout(note) {
    return {
      margin: { l: 48, r: 12, t: 8, b: 40 },  // as tall as its div (rollway.css)
      showlegend: true,
      // Above the plot: under it the legend ran into the x axis's title.
      legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" },
      // An empty chart's axes would only number an arbitrary range: the note stands alone.
      xaxis: { title: { text: "step" }, zeroline: false, visible: !note },
      yaxis: { zeroline: false, visible: !note },
      uirevision: "run",  // a redraw with more points keeps the reader's zoom
      annotations: note ? [{ text: note, showarrow: false, xref: "paper", yref: "paper",
                             x: 0.5, y: 0.5, font: { color: "#9ca3af" } }] : [],
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
    };
  }
  var plotConfig = { responsive: true, displaylogo: false };
  var maxPoints = 2000;     // the API's max_points per series, from its first answer

  // What an empty chart says: why it stays empty for this run (its pass is off, from the
  // run's config), or whether points may still come.
  function emptyNote(chart) {
    if (chart.div.dataset.empty) return chart.div.dataset.empty;
    return root.dataset.terminal === "true" ? "no points were recorded" : "waiting for data…";
  }

  document.querySelectorAll(".chart").forEach(function (div) {
    var chart = { div: div, series: div.dataset.series.split(",") };
    chart.series.forEach(function (name, index) {
      traceOf[name] = { chart: chart, index: index };
    });
    charts.push(chart);
  });

  function countPoints(chart) {
    var n = 0;
    (chart.div.data || []).forEach(function (trace) { n += trace.x.length; });
    chart.div.dataset.points = String(n);
  }

  function traceOfSeries(name, i, s) {
    return {
      name: name,
      x: s.steps.slice(),
      y: s.values.slice(),
      type: "scatter",
      mode: "lines+markers",
      marker: { size: 3 },
      line: { width: 1.5, color: palette[i % palette.length] },
    };
  }

  function draw(seriesData) {
    charts.forEach(function (chart) {
      var traces = chart.series.map(function (name, i) {
        var s = seriesData[name] || { steps: [], values: [] };
        // The API reads a series' last step and its points in two queries: a point that
        // lands in between is drawn here but newer than last_step. What is drawn counts.
        if (s.steps.length) lastStep[name] = Math.max(s.last_step, s.steps[s.steps.length - 1]);
        return traceOfSeries(name, i, s);
      });
      var empty = traces.every(function (t) { return t.x.length === 0; });
      Plotly.newPlot(chart.div, traces, chartLayout(empty ? emptyNote(chart) : ""), plotConfig);
      chart.empty = empty;
      chart.div.on("plotly_relayout", function (event) { onZoom(chart, event); });
      countPoints(chart);
    });
    drawn = true;
  }

  // One chart's series read again, downsampled over the whole run, in place of what it
  // drew; what was drawn after the answer's last step stays on the end of each trace.
  function reread(chart) {
    if (chart.rereading) return;
    chart.rereading = true;
    fetchSeries(undefined, chart.series).then(function (data) {
      var traces = chart.series.map(function (name, i) {
        var s = data.series[name] || { steps: [], values: [] };
        var drawnTrace = chart.div.data[i];
        var end = s.steps.length ? s.steps[s.steps.length - 1] : -Infinity;
        var trace = traceOfSeries(name, i, s);
        drawnTrace.x.forEach(function (step, k) {
          if (step > end) { trace.x.push(step); trace.y.push(drawnTrace.y[k]); }
        });
        return trace;
      });
      Plotly.react(chart.div, traces, chartLayout(""), plotConfig);
      delete chart.div.dataset.zoom;
      countPoints(chart);
    }).catch(function () { /* the cap still holds: the next append tries again */ }).finally(function () {
      chart.rereading = false;
    });
  }

  // The steps in view after a zoom, read again in detail; the whole run again after the
  // chart is reset. What was drawn after the answer's last step stays on each trace.
  function onZoom(chart, event) {
    if (event["xaxis.autorange"]) { chart.zoom = null; reread(chart); return; }
    var range = event["xaxis.range"] || [event["xaxis.range[0]"], event["xaxis.range[1]"]];
    var lo = range[0], hi = range[1];
    if (lo === undefined || hi === undefined) return;  // not the x axis: nothing to read
    chart.zoom = [Math.max(0, Math.floor(lo)), Math.ceil(hi)];
    var asked = chart.zoom;
    fetchSeries(undefined, chart.series, asked).then(function (data) {
      if (chart.zoom !== asked) return;  // zoomed again meanwhile: that answer draws
      var traces = chart.series.map(function (name, i) {
        return traceOfSeries(name, i, data.series[name] || { steps: [], values: [] });
      });
      Plotly.react(chart.div, traces, chartLayout(""), plotConfig);
      chart.div.dataset.zoom = asked.join("-");
      countPoints(chart);
    }).catch(function () { /* the downsampled points stay: the next zoom tries again */ });
  }

  function append(points) {
    // Group by chart, sorted by step, skipping what is already drawn.
    points.sort(function (a, b) { return a.step - b.step; });
    var updates = new Map();  // chart -> {x: [[...]], y: [[...]]}
    points.forEach(function (p) {
      var where = traceOf[p.series];
      if (!where) return;  // a series no chart shows
      if (lastStep[p.series] !== undefined && p.step <= lastStep[p.series]) return;
      lastStep[p.series] = p.step;
      var u = updates.get(where.chart);
      if (!u) {
        u = { x: where.chart.series.map(function () { return []; }),
              y: where.chart.series.map(function () { return []; }) };
        updates.set(where.chart, u);
      }
      u.x[where.index].push(p.step);
      u.y[where.index].push(p.value);
    });
    updates.forEach(function (u, chart) {
      var indices = chart.series.map(function (_, i) { return i; });
      var cap = 2 * maxPoints;
      Plotly.extendTraces(chart.div, u, indices, cap);
      if (chart.empty) {
        chart.empty = false;
        Plotly.relayout(chart.div, { annotations: [], "xaxis.visible": true, "yaxis.visible": true });
      }
      countPoints(chart);
      if (chart.div.data.some(function (trace) { return trace.x.length >= cap; })) reread(chart);
    });
  }

  function receive(points) {
    pending.push.apply(pending, points);
    if (!drawn || catchingUp || flushTimer) return;
    // Coalesce bursts into one redraw per chart; 50 ms keeps emit→screen well under 250 ms.
    flushTimer = setTimeout(function () {
      flushTimer = null;
      if (catchingUp) return;  // the catch-up's end flushes, answer and all
      var batch = pending;
      pending = [];
      append(batch);
    }, 50);
  }

  function fetchSeries(afterStep, names, range) {
    var params = new URLSearchParams();
    if (afterStep !== undefined) params.set("after_step", afterStep);
    if (names) params.set("series", names.join(","));
    if (range) { params.set("from_step", range[0]); params.set("to_step", range[1]); }
    var query = params.toString();
    return fetch(metricsUrl + (query ? "?" + query : ""),
                 { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("metrics API answered " + r.status);
        return r.json();
      });
  }

  function toPoints(seriesData) {
    var points = [];
    Object.keys(seriesData).forEach(function (name) {
      var s = seriesData[name];
      s.steps.forEach(function (step, i) {
        points.push({ series: name, step: step, value: s.values[i], time: s.times[i] });
      });
    });
    return points;
  }

  // -- phase and progress ------------------------------------------------------------
  // The driver's phase comes with the status; progress toward the stop condition
  // (stop.max_steps, or stop.max_minutes if that comes first) and the time left come
  // from the policy/version points: step and the engine's time of each.
  var phaseBox = document.getElementById("run-phase");
  var maxSteps = Number(phaseBox.dataset.maxSteps) || 0;
  var maxSeconds = (Number(phaseBox.dataset.maxMinutes) || 0) * 60;
  var stepTimes = [];       // [step, time] of policy/version, in step order
  var RATE_WINDOW = 20;     // steps the rate (and so the time left) is measured over

  function formatSeconds(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  function noteSteps(points) {
    points.forEach(function (p) {
      if (p.series !== "policy/version" || p.time === undefined) return;
      var last = stepTimes.length ? stepTimes[stepTimes.length - 1][0] : -1;
      if (p.step > last) stepTimes.push([p.step, p.time]);
    });
    showProgress();
  }

  function showProgress() {
    var bar = document.getElementById("run-progress");
    var text = document.getElementById("progress-text");
    if (phaseBox.dataset.status !== "running" || stepTimes.length === 0 || (!maxSteps && !maxSeconds)) {
      bar.hidden = true;
      text.textContent = "";
      return;
    }
    var last = stepTimes[stepTimes.length - 1];
    // The loops started about one step before the first point.
    var first = stepTimes[0];
    var recent = stepTimes[Math.max(0, stepTimes.length - 1 - RATE_WINDOW)];
    var rate = last[0] > recent[0] ? (last[0] - recent[0]) / (last[1] - recent[1]) : null;  // steps/s
    var elapsed = last[1] - first[1] + (rate ? 1 / rate : 0);
    var fraction = 0, left = [], parts = [];
    if (maxSteps) {
      fraction = Math.max(fraction, last[0] / maxSteps);
      parts.push("step " + last[0] + " of " + maxSteps);
      if (rate) left.push((maxSteps - last[0]) / rate);
    }
    if (maxSeconds) {
      fraction = Math.max(fraction, elapsed / maxSeconds);
      left.push(maxSeconds - elapsed);
    }
    fraction = Math.min(1, fraction);
    document.getElementById("progress-bar").style.width = (100 * fraction).toFixed(1) + "%";
    bar.setAttribute("aria-valuenow", (100 * fraction).toFixed(0));
    bar.hidden = false;
    if (rate) parts.push(rate.toFixed(2) + " steps/s");
    if (left.length && rate) parts.push("~" + formatSeconds(Math.min.apply(null, left)) + " left");
    text.textContent = parts.join(" · ");
  }

  function showPhase(run) {
    phaseBox.dataset.status = run.status;
    phaseBox.dataset.phase = run.phase || "";
    phaseBox.hidden = run.status !== "running" || !run.phase;
    document.getElementById("phase-name").textContent = run.phase || "";
    document.getElementById("phase-detail").textContent = run.phase_detail || "";
    showProgress();
  }

  // Each action the run's status allows, and only those; an element is absent where the
  // reader's role does not allow the action at all.
  function showActions(run) {
    var shown = {
      "cancel-form": !run.is_terminal && run.status !== "cancelling",
      "retry-form": run.is_terminal,
      "resume-form": run.is_terminal,
      "download-model": run.status === "succeeded",
    };
    Object.keys(shown).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.hidden = !shown[id];
    });
    // "Run #N queued." is no longer true once the run has ended.
    if (run.is_terminal) {
      document.querySelectorAll(".messages li.until-run-ends").forEach(function (li) {
        var list = li.parentNode;
        li.remove();
        if (!list.querySelector("li")) list.remove();
      });
    }
  }

  // As dashboard/pages.py's final_note says it: the page stops claiming "live".
  var ENDED_AS = { succeeded: "succeeded", failed: "failed", cancelled: "was cancelled" };
  function showFinal(run) {
    var el = document.getElementById("live-state");
    var at = run.finished_at ? " at " + new Date(run.finished_at).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "";
    el.dataset.state = "final";
    el.textContent = "final — the run " + (ENDED_AS[run.status] || run.status) + at;
  }

  function showStatus(run) {
    finished = Boolean(run.is_terminal);
    var ended = finished && root.dataset.terminal !== "true";
    root.dataset.terminal = String(finished);
    if (ended) showFinal(run);
    Rollway.setStatus(root, run);
    showPhase(run);
    showActions(run);
    showError(run);
    if (ended && drawn) {  // an empty chart now waits for nothing
      charts.forEach(function (chart) {
        if (chart.empty) Plotly.relayout(chart.div, { "annotations[0].text": emptyNote(chart) });
      });
    }
  }

  // Why the run failed (a sentence) and, folded, the traceback behind it. A traceback
  // already shown is left alone: rewriting it would lose the reader's scroll and selection.
  function showError(run) {
    document.getElementById("run-failure").hidden = !run.error;
    document.getElementById("run-error").textContent = run.error || "";
    var detail = run.error_detail || "";
    var box = document.getElementById("run-error-detail");
    var text = document.getElementById("run-error-traceback");
    if (text.textContent !== detail) text.textContent = detail;
    box.hidden = !detail;
  }

  // What the socket would have pushed since the lowest step drawn (appends skip the rest).
  // Live points that arrive meanwhile wait in `pending` and go with the answer, sorted:
  // drawn first, a newer step would make append() skip the older ones the answer brings.
  function catchUp() {
    var steps = Object.keys(lastStep).map(function (k) { return lastStep[k]; });
    var after = steps.length ? Math.min.apply(null, steps) : undefined;
    catchingUp += 1;
    return fetchSeries(after).then(function (data) {
      var points = toPoints(data.series);
      noteSteps(points);
      pending.push.apply(pending, points);
    }).finally(function () {
      catchingUp -= 1;
      receive([]);
    });
  }

  // While the socket is down (Redis, the channel layer, unreachable; the web process
  // restarting) the charts keep growing from the metrics API; once it is back, one last
  // catch-up covers the points between the last poll and the socket joining its group.
  var POINTS_POLL_MS = 3000;
  var socketDown = false;
  var finished = false;     // the run is terminal: one more poll gets its last points
  var pollTimer = null;     // one poll loop at a time, however often the socket drops
  function pollPoints() {
    pollTimer = setTimeout(function () {
      pollTimer = null;
      var last = finished;
      catchUp().catch(function () { /* the site is down too: try again */ }).then(function () {
        if (socketDown && !last && pollTimer === null) pollPoints();
      });
    }, POINTS_POLL_MS);
  }

  // The first read of every series, then the charts; retried while the API fails.
  var started = false;
  function start() {
    if (started) return;
    started = true;
    fetchSeries().then(function (data) {
      maxPoints = data.max_points || maxPoints;
      noteSteps(toPoints({ "policy/version": data.series["policy/version"] || { steps: [], values: [], times: [] } }));
      draw(data.series);
      var batch = pending;
      pending = [];
      append(batch);
    }).catch(function (err) {
      document.getElementById("live-state").textContent = String(err);
      started = false;
      setTimeout(start, POINTS_POLL_MS);
    });
  }

  // The first read waits for the socket to have joined the run's group (or to have
  // failed): a point stored after the read is then pushed to the socket, so none falls
  // between the API answer and the first live message; live ones wait in `pending`.
  Rollway.openSocket(root.dataset.livePath, {
    onMessage: function (msg) {
      if (msg.type === "points") { noteSteps(msg.points); receive(msg.points); }
      else if (msg.type === "status") showStatus(msg.run);
    },
    onDown: function () {
      start();
      if (socketDown) return;
      socketDown = true;
      if (pollTimer === null) pollPoints();
    },
    onOpen: function () {
      start();
      if (!socketDown) return;
      socketDown = false;
      clearTimeout(pollTimer);
      pollTimer = null;
      catchUp().catch(function () { setTimeout(catchUp, POINTS_POLL_MS); });
    },
  });
  setTimeout(start, 3000);  // a socket that neither opens nor closes (a stalled proxy)

  // Without a shared channel layer (no REDIS_URL) status changes made by the Celery
  // worker never reach this socket: poll the run while it is unfinished, as a fallback.
  var STATUS_POLL_MS = 5000;
  var statusUrl = root.dataset.runUrl;
  (function pollStatus() {
    fetch(statusUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (run) {
        if (run) showStatus(run);
        if (!run || !run.is_terminal) setTimeout(pollStatus, STATUS_POLL_MS);
      })
      .catch(function () { setTimeout(pollStatus, STATUS_POLL_MS); });
  })();
})();
