// Run page: draw each chart from the metrics API, then append live points from
// /ws/runs/<id>/ with Plotly.extendTraces: no reload, no full redraw.
//
// Points are (series, step, value, time); x is the trainer step, shared by every
// series. lastStep[series] makes appends idempotent: a point re-sent by the engine's
// spool, or one already in the API answer, is never drawn twice.
"use strict";

(function () {
  var root = document.getElementById("run");
  var metricsUrl = root.dataset.metricsUrl;
  var charts = [];          // {div, series: [name, ...], drawn: bool}
  var traceOf = {};         // series name -> {chart, index}
  var lastStep = {};        // series name -> highest step drawn
  var pending = [];         // points received before the charts were drawn
  var drawn = false;
  var flushTimer = null;

  var palette = ["#2563eb", "#dc2626", "#059669", "#d97706"];
  var layout = {
    margin: { l: 48, r: 12, t: 8, b: 36 },
    height: 240,
    showlegend: true,
    legend: { orientation: "h", y: -0.25 },
    xaxis: { title: { text: "step" }, zeroline: false },
    yaxis: { zeroline: false },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
  };
  var plotConfig = { responsive: true, displaylogo: false };
  var waiting = { text: "waiting for data…", showarrow: false, xref: "paper", yref: "paper",
                  x: 0.5, y: 0.5, font: { color: "#9ca3af" } };

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

  function draw(seriesData) {
    charts.forEach(function (chart) {
      var traces = chart.series.map(function (name, i) {
        var s = seriesData[name] || { steps: [], values: [] };
        if (s.steps.length) lastStep[name] = s.last_step;
        return {
          name: name,
          x: s.steps.slice(),
          y: s.values.slice(),
          type: "scatter",
          mode: "lines+markers",
          marker: { size: 3 },
          line: { width: 1.5, color: palette[i % palette.length] },
        };
      });
      var empty = traces.every(function (t) { return t.x.length === 0; });
      var chartLayout = Object.assign({}, layout, { annotations: empty ? [waiting] : [] });
      Plotly.newPlot(chart.div, traces, chartLayout, plotConfig);
      chart.empty = empty;
      countPoints(chart);
    });
    drawn = true;
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
      Plotly.extendTraces(chart.div, u, indices);
      if (chart.empty) {
        chart.empty = false;
        Plotly.relayout(chart.div, { annotations: [] });
      }
      countPoints(chart);
    });
  }

  function receive(points) {
    pending.push.apply(pending, points);
    if (!drawn || flushTimer) return;
    // Coalesce bursts into one redraw per chart; 50 ms keeps emit→screen well under 250 ms.
    flushTimer = setTimeout(function () {
      flushTimer = null;
      var batch = pending;
      pending = [];
      append(batch);
    }, 50);
  }

  function fetchSeries(afterStep) {
    var url = metricsUrl + (afterStep === undefined ? "" : "?after_step=" + afterStep);
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
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
        points.push({ series: name, step: step, value: s.values[i] });
      });
    });
    return points;
  }

  function showStatus(run) {
    Rollway.setStatus(root, run);
    document.getElementById("cancel-form").hidden = run.is_terminal || run.status === "cancelling";
    var err = document.getElementById("run-error");
    err.textContent = run.error || "";
    err.hidden = !run.error;
  }

  // Open the socket first and buffer, so no point falls between the API answer and
  // the first live message.
  Rollway.openSocket(root.dataset.livePath, {
    onMessage: function (msg) {
      if (msg.type === "points") receive(msg.points);
      else if (msg.type === "status") showStatus(msg.run);
    },
    onReopen: function () {
      // Catch up on what arrived while we were disconnected.
      var steps = Object.keys(lastStep).map(function (k) { return lastStep[k]; });
      var after = steps.length ? Math.min.apply(null, steps) : undefined;
      fetchSeries(after).then(function (data) { receive(toPoints(data.series)); });
    },
  });

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

  fetchSeries().then(function (data) {
    draw(data.series);
    var batch = pending;
    pending = [];
    append(batch);
  }).catch(function (err) {
    document.getElementById("live-state").textContent = String(err);
  });
})();
