// Compare page: every metric of the vocabulary overlaid for the runs in ?runs=,
// one trace per configuration (mean over seeds with a min–max band) or per run when a
// configuration has a single seed; a config table (diff-only, pinned baseline) and a
// summary table. The page's whole state lives in its URL (runs, x, diff, baseline,
// target, budget), so a copied link reproduces the view. The page first loads the
// tables only; each chart asks for its own series (what=charts) when it comes into view,
// so 50 runs × 30 metrics never travel at once. While any run is unfinished the page
// polls /api/compare (tables and the charts already shown) and redraws with
// Plotly.react (no reload).
"use strict";

(function () {
  var root = document.getElementById("compare");
  var apiUrl = root.dataset.apiUrl;
  var POLL_MS = 5000;
  var palette = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f"];
  var params = new URLSearchParams(window.location.search);
  var state = {
    runs: root.dataset.runs,
    x: params.get("x") || "step",
    diff: params.get("diff") === "1",
    baseline: params.get("baseline") || "",
    target: params.get("target") || "0.8",
    budget: params.get("budget") || "60",
  };
  var data = null;
  var firstChart = true;
  var metrics = JSON.parse(document.getElementById("compare-metrics").textContent);
  var plotlyReady = new Promise(function (resolve, reject) {
    var script = document.createElement("script");
    script.src = root.dataset.plotlySrc;
    script.onload = resolve;
    script.onerror = function () { reject(new Error("could not load Plotly from " + script.src)); };
    document.head.appendChild(script);
  });
  // Read by bench/compare_scale.py with firstChartMs: when Plotly was ready to draw.
  plotlyReady.then(function () { document.body.dataset.plotlyMs = String(Math.round(performance.now())); });
  // metric → {runs: {run id: series}, bands: {configuration id: band}}, for the charts
  // that have been in view (`wanted`), in the order they came into view.
  var chartData = {};
  var wanted = [];

  var el = {
    x: document.getElementById("x-axis"),
    diff: document.getElementById("diff-only"),
    baseline: document.getElementById("baseline"),
    target: document.getElementById("target"),
    budget: document.getElementById("budget"),
    live: document.getElementById("live-state"),
  };
  el.x.value = state.x;
  el.diff.checked = state.diff;
  el.target.value = state.target;
  el.budget.value = state.budget;

  function query(extra) {
    var q = new URLSearchParams({ runs: state.runs, target: state.target, budget: state.budget });
    Object.keys(extra || {}).forEach(function (k) { q.set(k, extra[k]); });
    return q.toString();
  }

  function saveState() {
    var q = new URLSearchParams({ runs: state.runs, x: state.x });
    if (state.diff) q.set("diff", "1");
    if (state.baseline) q.set("baseline", state.baseline);
    q.set("target", state.target);
    q.set("budget", state.budget);
    history.replaceState(null, "", window.location.pathname + "?" + q.toString());
    ["summary", "series"].forEach(function (what) {
      ["csv", "json"].forEach(function (fmt) {
        document.getElementById("export-" + what + "-" + fmt).href =
          apiUrl + "?" + query({ format: fmt, what: what });
      });
    });
  }

  function fmt(v) {
    if (v === null || v === undefined) return "—";
    if (typeof v !== "number") return typeof v === "object" ? JSON.stringify(v) : String(v);
    if (Number.isInteger(v)) return String(v);
    var a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : v.toPrecision(4);
  }

  function colorOf(index) { return palette[index % palette.length]; }

  function rgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  function xs(seriesOrBand, spp, isBand) {
    if (state.x === "wall") return isBand ? seriesOrBand.wall : seriesOrBand.wall;
    if (state.x === "samples") return seriesOrBand.steps.map(function (s) { return s * spp; });
    return seriesOrBand.steps;
  }

  function tracesFor(metric) {
    var traces = [];
    var runsById = {};
    data.runs.forEach(function (r) { runsById[r.id] = r; });
    data.configurations.forEach(function (c, ci) {
      var color = colorOf(ci);
      var band = chartData[metric].bands[c.id];
      if (band) {
        var spp = runsById[c.runs[0]].samples_per_step;
        var x = xs(band, spp, true);
        traces.push({ x: x, y: band.min, type: "scatter", mode: "lines", line: { width: 0, color: color },
                      legendgroup: c.id, showlegend: false, hoverinfo: "skip", name: c.label + " min" });
        traces.push({ x: x, y: band.max, type: "scatter", mode: "lines", line: { width: 0, color: color },
                      fill: "tonexty", fillcolor: rgba(color, 0.18), legendgroup: c.id, showlegend: false,
                      hoverinfo: "skip", name: c.label + " max" });
        traces.push({ x: x, y: band.mean, type: "scatter", mode: "lines", line: { width: 1.8, color: color },
                      legendgroup: c.id, name: c.label + " (mean of " + c.runs.length + " seeds)" });
        return;
      }
      c.runs.forEach(function (runId) {
        var r = runsById[runId];
        var s = chartData[metric].runs[runId];
        if (!s) return;
        traces.push({ x: xs(s, r.samples_per_step, false), y: s.values, type: "scatter", mode: "lines",
                      line: { width: 1.5, color: color }, legendgroup: c.id, name: "#" + r.id + " " + c.label });
      });
    });
    return traces;
  }

  var xTitle = { step: "step", wall: "wall time (s)", samples: "samples seen" };

  var observer = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    var names = [];
    entries.forEach(function (e) {
      var metric = e.target.dataset.metric;
      if (e.isIntersecting && wanted.indexOf(metric) < 0) { wanted.push(metric); names.push(metric); }
    });
    if (names.length) loadCharts(names);
  }, { rootMargin: "400px" }) : null;

  function chartDiv(m) {
    var id = "chart-" + m.name.replace(/[^a-z0-9]+/gi, "-");
    var div = document.getElementById(id);
    if (div) return div;
    var fig = document.createElement("figure");
    fig.className = "chart-card";
    var cap = document.createElement("figcaption");
    cap.textContent = m.name + (m.unit ? " (" + m.unit + ")" : "");
    cap.title = m.help;
    div = document.createElement("div");
    div.className = "chart";
    div.id = id;
    div.dataset.metric = m.name;
    div.dataset.state = "waiting";
    div.textContent = "loading when in view…";
    fig.appendChild(cap);
    fig.appendChild(div);
    document.getElementById("charts").appendChild(fig);
    if (observer) observer.observe(div);
    else if (wanted.indexOf(m.name) < 0) wanted.push(m.name);
    return div;
  }

  function drawChart(m) {
    var div = chartDiv(m);
    if (!chartData[m.name]) return;
    if (div.dataset.state === "waiting") { div.textContent = ""; div.dataset.state = "drawn"; }
    var traces = tracesFor(m.name);
    var layout = {
      margin: { l: 48, r: 12, t: 8, b: 40 }, showlegend: true,  // as tall as its div (rollway.css)
      // Above the plot: under it the legend ran into the x axis's title.
      legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" }, uirevision: state.x,
      // An empty chart's axes would only number an arbitrary range: the note stands alone.
      xaxis: { title: { text: xTitle[state.x] }, zeroline: false, visible: traces.length > 0 },
      yaxis: { zeroline: false, visible: traces.length > 0 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      annotations: traces.length ? [] : [{ text: "no run has this series", showarrow: false, xref: "paper",
                                            yref: "paper", x: 0.5, y: 0.5, font: { color: "#9ca3af" } }],
    };
    Plotly.react(div, traces, layout, { responsive: true, displaylogo: false });
    div.dataset.traces = String(traces.length);
    div.dataset.points = String(traces.reduce(function (n, t) { return n + t.x.length; }, 0));
    if (firstChart && traces.length) {
      firstChart = false;
      // Read by bench/compare_scale.py: ms from navigation start to the first drawn chart.
      document.body.dataset.firstChartMs = String(Math.round(performance.now()));
    }
  }

  function drawCharts() {
    if (data) metrics.forEach(drawChart);
  }

  function takeCharts(body, names) {
    names.forEach(function (name) {
      var one = { runs: {}, bands: {} };
      Object.keys(body.series).forEach(function (runId) {
        if (body.series[runId][name]) one.runs[runId] = body.series[runId][name];
      });
      Object.keys(body.bands).forEach(function (cid) {
        if (body.bands[cid][name]) one.bands[cid] = body.bands[cid][name];
      });
      chartData[name] = one;
    });
  }

  function getJSON(extra) {
    return fetch(apiUrl + "?" + query(extra), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) return r.json().then(function (b) { throw new Error(JSON.stringify(b.errors)); });
        return r.json();
      });
  }

  function loadCharts(names) {
    // asked at once, drawn once the tables (for the configurations) and Plotly are here
    var answer = getJSON({ what: "charts", series: names.join(",") });
    return Promise.all([answer, tablesReady, plotlyReady]).then(function (got) {
      takeCharts(got[0], names);
      if (!data) return;  // the tables failed: the error is shown, the next poll retries
      metrics.forEach(function (m) { if (names.indexOf(m.name) >= 0) drawChart(m); });
    }).catch(showError);
  }

  function drawBaselineChoices() {
    var configs = data.configurations;
    if (!configs.some(function (c) { return c.id === state.baseline; })) state.baseline = "";
    el.baseline.innerHTML = "";
    var none = document.createElement("option");
    none.value = "";
    none.textContent = "none";
    el.baseline.appendChild(none);
    configs.forEach(function (c) {
      var o = document.createElement("option");
      o.value = c.id;
      o.textContent = c.id + ": " + c.label;
      el.baseline.appendChild(o);
    });
    el.baseline.value = state.baseline;
  }

  function orderedConfigs() {
    // The pinned baseline is the first column; the others keep their order.
    var configs = data.configurations.map(function (c, i) { return { c: c, index: i }; });
    if (!state.baseline) return configs;
    return configs.filter(function (o) { return o.c.id === state.baseline; })
      .concat(configs.filter(function (o) { return o.c.id !== state.baseline; }));
  }

  function cell(tag, text, cls) {
    var td = document.createElement(tag);
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function drawConfigTable() {
    var table = document.getElementById("config-table");
    table.innerHTML = "";
    var order = orderedConfigs();
    var head = document.createElement("tr");
    head.appendChild(cell("th", "setting"));
    order.forEach(function (o) {
      var th = cell("th", o.c.id + ": " + o.c.label + " · runs " + o.c.runs.join(", "),
                    o.c.id === state.baseline ? "baseline" : "");
      th.dataset.configuration = o.c.id;
      head.appendChild(th);
    });
    table.appendChild(head);
    data.config_table.forEach(function (row) {
      var tr = document.createElement("tr");
      tr.dataset.key = row.key;
      tr.dataset.differs = row.differs ? "1" : "0";
      tr.hidden = state.diff && !row.differs;
      tr.appendChild(cell("th", row.key));
      var base = state.baseline ? row.values[order[0].index] : undefined;
      order.forEach(function (o) {
        var v = row.values[o.index];
        var text = fmt(v);
        var cls = "";
        if (state.baseline && o.c.id !== state.baseline) {
          if (JSON.stringify(v) === JSON.stringify(base)) { text = "="; cls = "same"; }
          else if (typeof v === "number" && typeof base === "number") {
            text = (v - base >= 0 ? "+" : "") + fmt(v - base) + " (" + fmt(v) + ")"; cls = "changed";
          } else { text = "≠ " + fmt(v); cls = "changed"; }
        } else if (o.c.id === state.baseline) { cls = "baseline"; }
        var td = cell("td", text, cls);
        td.dataset.configuration = o.c.id;
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
  }

  function drawSummary() {
    var table = document.getElementById("summary-table");
    table.innerHTML = "";
    var s = data.summary;
    var head = document.createElement("tr");
    head.appendChild(cell("th", "configuration"));
    s.columns.forEach(function (col) {
      var th = cell("th", col.label + ({ higher: " ↑", lower: " ↓" }[col.better] || " → 1"));
      th.title = col.help + " (" + col.unit + "; " + col.better + " is better)";
      th.dataset.column = col.key;
      head.appendChild(th);
    });
    table.appendChild(head);
    s.rows.forEach(function (row) {
      var tr = document.createElement("tr");
      tr.dataset.configuration = row.configuration;
      tr.appendChild(cell("th", row.configuration + ": " + row.label));
      s.columns.forEach(function (col) {
        var c = row.cells[col.key];
        var best = s.best[col.key].indexOf(row.configuration) >= 0;
        var text = c.mean === null ? "—" : fmt(c.mean) + (c.n > 1 ? " ± " + fmt(c.spread) : "") + (best ? " ★" : "");
        var td = cell("td", text, best ? "best" : "");
        td.dataset.column = col.key;
        if (c.mean !== null) td.dataset.mean = String(c.mean);
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
  }

  function drawAll() {
    drawBaselineChoices();
    drawSummary();
    drawConfigTable();
    plotlyReady.then(drawCharts);
    saveState();
  }

  var pollTimer = null;
  function showError(err) {
    el.live.dataset.state = "error";
    el.live.textContent = String(err);
  }

  function load() {
    // the tables, and the series of every chart already shown, in one answer
    return getJSON({ series: wanted.join(",") })
      .then(function (body) {
        data = body;
        if (wanted.length) {
          var series = {};
          body.runs.forEach(function (r) { series[r.id] = r.series; });
          takeCharts({ series: series, bands: body.bands }, wanted);
        }
        drawAll();
        var running = data.runs.some(function (r) { return !r.is_terminal; });
        el.live.dataset.state = running ? "live" : "done";
        el.live.textContent = running ? "live: refreshing every " + POLL_MS / 1000 + " s" : "all runs finished";
        clearTimeout(pollTimer);
        if (running) pollTimer = setTimeout(load, POLL_MS);
        if (!observer && wanted.length && Object.keys(chartData).length === 0) loadCharts(wanted);
      })
      .catch(function (err) {
        showError(err);
        pollTimer = setTimeout(load, POLL_MS);
      });
  }

  el.x.addEventListener("change", function () { state.x = el.x.value; plotlyReady.then(drawCharts); saveState(); });
  el.diff.addEventListener("change", function () { state.diff = el.diff.checked; drawConfigTable(); saveState(); });
  el.baseline.addEventListener("change", function () {
    state.baseline = el.baseline.value; drawConfigTable(); saveState();
  });
  [el.target, el.budget].forEach(function (input) {
    input.addEventListener("change", function () {
      state.target = el.target.value || "0.8";
      state.budget = el.budget.value || "60";
      saveState();
      load();
    });
  });
  saveState();
  // The chart cards exist before any answer, so the charts in view ask for their series
  // while the tables and Plotly (a few MB) are still on their way.
  metrics.forEach(chartDiv);
  var tablesReady = load();
})();
