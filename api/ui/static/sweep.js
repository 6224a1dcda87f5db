// A sweep's page: the trial table (sortable, the sort kept in the URL's hash), every trial's curve on one chart
// (Charts.line: the zoom survives updates), a parallel-coordinates view of the searched values against the
// metric (SVG), and the best trial. Live.poll keeps all of it current in place.
"use strict";

(() => {
  const page = App.pageData("page-data");
  if (!page) return;
  const SVG = "http://www.w3.org/2000/svg";
  let state = page.initial;

  // --- the trial table -----------------------------------------------------------------------------------
  const table = document.getElementById("trials");
  const params = state.params.map((p) => p.path);
  // The reader's choices live in the URL's hash (sort=, dir=, metric=): a reload or a shared link keeps them.
  const sort = { key: "number", desc: false };
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("sort")) {
    sort.key = hash.get("sort");
    sort.desc = hash.get("dir") === "desc";
  }
  let curveMetric = hash.get("metric") || state.sweep.metric;

  function saveChoices() {
    const choices = new URLSearchParams({ sort: sort.key, dir: sort.desc ? "desc" : "asc" });
    if (curveMetric !== state.sweep.metric) choices.set("metric", curveMetric);
    history.replaceState(null, "", `${location.pathname}${location.search}#${choices}`);
  }

  function sortValue(trial, key) {
    if (key === "metric") return trial.best_metric;
    if (key.startsWith("param:")) return trial.config[key.slice(6)];
    return trial[key];
  }

  function compare(a, b) {
    const va = sortValue(a, sort.key);
    const vb = sortValue(b, sort.key);
    if (va == null && vb == null) return a.number - b.number;
    if (va == null) return 1; // trials without a value last, whichever the direction
    if (vb == null) return -1;
    const order = typeof va === "number" && typeof vb === "number" ? va - vb : String(va).localeCompare(String(vb));
    return (sort.desc ? -order : order) || a.number - b.number;
  }

  function cell(text, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    td.textContent = text == null ? "" : String(text);
    return td;
  }

  function renderTrials() {
    const body = table.tBodies[0];
    const rows = [...state.trials].sort(compare);
    const bestId = state.sweep.best_trial ? state.sweep.best_trial.id : null;
    const fragment = document.createDocumentFragment();
    for (const trial of rows) {
      const tr = document.createElement("tr");
      tr.dataset.trialId = trial.id;
      if (trial.id === bestId) tr.className = "best";
      tr.appendChild(cell(trial.number, "num"));
      const st = document.createElement("td");
      const badge = document.createElement("span");
      badge.className = "badge state-" + trial.state.toLowerCase();
      badge.dataset.field = "state";
      badge.textContent = trial.state;
      st.appendChild(badge);
      if (trial.stopped_early) {
        const early = document.createElement("span");
        early.className = "badge state-stopped";
        early.dataset.testid = "stopped-early";
        early.title = "stopped early by the scheduler";
        early.textContent = "stopped early";
        st.append(" ", early);
      }
      tr.appendChild(st);
      const metric = cell(trial.best_metric == null ? "" : App.formatNumber(trial.best_metric), "num");
      metric.dataset.field = "metric";
      tr.appendChild(metric);
      tr.appendChild(cell(trial.iterations, "num"));
      for (const path of params) tr.appendChild(cell(trial.config[path], "mono"));
      const why = document.createElement("td");
      why.innerHTML = `<div class="why${trial.state === "FAILED" ? " failed" : ""}">${
        trial.reason ? `<code>${App.escapeHtml(trial.reason)}</code> ` : ""
      }${App.escapeHtml(trial.message)}</div>`;
      tr.appendChild(why);
      fragment.appendChild(tr);
    }
    if (rows.length) body.replaceChildren(fragment);
    table.querySelectorAll("th button[data-sort]").forEach((button) => {
      const on = button.dataset.sort === sort.key;
      button.dataset.active = on ? (sort.desc ? "desc" : "asc") : "";
      button.textContent = button.textContent.replace(/ [▲▼]$/, "") + (on ? (sort.desc ? " ▼" : " ▲") : "");
    });
  }

  table.querySelectorAll("th button[data-sort]").forEach((button) => {
    button.addEventListener("click", () => {
      const key = button.dataset.sort;
      if (sort.key === key) sort.desc = !sort.desc;
      else {
        sort.key = key;
        // The metric: best first (its mode says which way); anything else ascending first.
        sort.desc = key === "metric" ? state.sweep.mode === "max" : false;
      }
      saveChoices();
      renderTrials();
    });
  });

  // --- every trial's curve on one chart --------------------------------------------------------------------
  const chartElement = document.getElementById("sweep-chart");
  const chart = Charts.line(chartElement, { xLabel: "epoch", height: 320 });
  document.getElementById("log-scale").addEventListener("change", (event) => chart.setOptions({ log: event.target.checked }));

  const metricSelect = document.getElementById("curve-metric");

  function renderCurves() {
    const curves = state.curves;
    // New metric names (a trial reported one for the first time) join the choices; the choice stays.
    const have = new Set([...metricSelect.options].map((o) => o.value));
    for (const name of curves.metrics) {
      if (!have.has(name)) metricSelect.add(new Option(name, name));
    }
    metricSelect.value = curves.metric;
    document.getElementById("curves-metric").textContent = curves.metric;
    const empty = document.getElementById("no-curves");
    empty.textContent = curves.pending ? "Loading the curves…" : "No trial has reported this metric yet.";
    empty.classList.toggle("hidden", curves.series.length > 0);
    chartElement.classList.toggle("hidden", curves.series.length === 0);
    document.getElementById("curves-info").textContent = curves.series.length
      ? `${curves.series.length} trial(s), ${curves.x.length} epoch value(s)`
      : "";
    if (curves.series.length) chart.update({ x: curves.x, series: curves.series.map((s) => ({ label: s.label, y: s.y, points: true })) });
  }

  // --- parallel coordinates: each searched value and the metric ------------------------------------------
  const parallel = document.getElementById("parallel");

  function svg(name, attributes, text) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
    if (text != null) node.textContent = text;
    return node;
  }

  function axisOf(label, values, log) {
    const present = values.filter((v) => v != null);
    const numeric = present.length > 0 && present.every((v) => typeof v === "number");
    if (numeric) {
      const useLog = log && present.every((v) => v > 0);
      const f = useLog ? Math.log10 : (v) => v;
      const lo = Math.min(...present.map(f));
      const hi = Math.max(...present.map(f));
      return {
        label,
        position: (v) => (v == null ? null : hi === lo ? 0.5 : (f(v) - lo) / (hi - lo)),
        ticks: [
          [0, App.formatNumber(useLog ? 10 ** lo : lo)],
          [1, App.formatNumber(useLog ? 10 ** hi : hi)],
        ],
      };
    }
    const categories = [...new Set(present.map((v) => JSON.stringify(v)))].sort();
    const at = (key) => (categories.length === 1 ? 0.5 : categories.indexOf(key) / (categories.length - 1));
    return {
      label,
      position: (v) => (v == null ? null : at(JSON.stringify(v))),
      ticks: categories.slice(0, 12).map((key) => [at(key), key.replace(/^"|"$/g, "")]),
    };
  }

  function renderParallel() {
    const trials = state.trials.filter((t) => t.best_metric != null);
    parallel.replaceChildren();
    if (!trials.length) {
      parallel.appendChild(Object.assign(document.createElement("p"), { className: "muted", textContent: "No trial has a metric yet." }));
      return;
    }
    const axes = state.params.map((p) => axisOf(p.path, trials.map((t) => t.config[p.path]), p.log));
    axes.push(axisOf(state.sweep.metric, trials.map((t) => t.best_metric), false));
    const width = Math.max(parallel.clientWidth || 800, 320);
    const height = 300;
    const margin = { left: 60, right: 60, top: 28, bottom: 18 };
    const x = (i) => margin.left + (axes.length === 1 ? 0 : (i * (width - margin.left - margin.right)) / (axes.length - 1));
    const y = (p) => margin.top + (1 - p) * (height - margin.top - margin.bottom);
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "parallel coordinates" });
    const metrics = trials.map((t) => t.best_metric);
    const lo = Math.min(...metrics);
    const hi = Math.max(...metrics);
    const goodness = (m) => {
      const t = hi === lo ? 1 : (m - lo) / (hi - lo);
      return state.sweep.mode === "max" ? t : 1 - t;
    };
    const bestId = state.sweep.best_trial ? state.sweep.best_trial.id : null;
    const ordered = [...trials].sort((a, b) => (a.id === bestId) - (b.id === bestId) || goodness(a.best_metric) - goodness(b.best_metric));
    for (const trial of ordered) {
      const values = [...state.params.map((p) => trial.config[p.path]), trial.best_metric];
      const points = values
        .map((v, i) => {
          const p = axes[i].position(v);
          return p == null ? null : `${x(i).toFixed(1)},${y(p).toFixed(1)}`;
        })
        .filter(Boolean)
        .join(" ");
      const g = goodness(trial.best_metric);
      const shade = Math.round(165 - 135 * g);
      const isBest = trial.id === bestId;
      const line = svg("polyline", {
        points,
        fill: "none",
        stroke: isBest ? "#16a34a" : `rgb(${shade},${shade + 20},235)`,
        "stroke-width": isBest ? 3 : 1.5,
        "stroke-opacity": isBest ? 1 : 0.8,
        "data-trial-id": trial.id,
      });
      line.appendChild(svg("title", {}, `trial ${trial.number}: ${state.sweep.metric} ${App.formatNumber(trial.best_metric)}`));
      root.appendChild(line);
    }
    axes.forEach((axis, i) => {
      root.appendChild(svg("line", { x1: x(i), x2: x(i), y1: y(0), y2: y(1), stroke: "#6b7280", "stroke-width": 1 }));
      root.appendChild(svg("text", { x: x(i), y: 14, "text-anchor": "middle", "font-size": 12, "font-weight": 600 }, axis.label));
      for (const [p, text] of axis.ticks) {
        root.appendChild(svg("text", { x: x(i) + 4, y: y(p) + 4, "font-size": 11, fill: "#374151" }, text));
      }
    });
    parallel.appendChild(root);
  }

  // --- the header and the best trial -------------------------------------------------------------------
  function renderHeader() {
    const sweep = state.sweep;
    const badge = document.getElementById("sweep-state");
    badge.textContent = sweep.state;
    badge.className = "badge state-" + sweep.state.toLowerCase();
    const reason = document.getElementById("sweep-reason");
    reason.classList.toggle("hidden", !sweep.reason);
    reason.classList.toggle("waiting", sweep.state === "QUEUED");
    reason.querySelector('[data-field="reason"]').textContent = sweep.reason;
    reason.querySelector('[data-field="message"]').textContent = sweep.message;
    const cancel = document.getElementById("sweep-cancel-form");
    if (cancel) cancel.classList.toggle("hidden", sweep.terminal);
    const counts = document.getElementById("trial-counts");
    counts.innerHTML =
      Object.entries(sweep.trials)
        .filter(([, n]) => n)
        .map(([s, n]) => `<span class="badge state-${s.toLowerCase()}">${s.toLowerCase()} ${n}</span> `)
        .join("") + `<span class="muted">of ${sweep.total_trials}</span>`;
    const best = sweep.best_trial;
    document.getElementById("best-none").classList.toggle("hidden", !!best);
    document.getElementById("best-details").classList.toggle("hidden", !best);
    if (best) {
      document.getElementById("best-number").textContent = sweep.best_number;
      document.getElementById("best-metric").textContent = App.formatNumber(best.metric);
      document.getElementById("best-epoch").textContent = best.epoch == null ? "" : best.epoch;
      document.getElementById("best-config").textContent = Object.entries(best.config)
        .map(([k, v]) => `${k}=${v}`)
        .join(" ");
    }
    const form = document.getElementById("deploy-form");
    if (form) {
      form.classList.toggle("hidden", !best);
      if (best) document.getElementById("deploy-trial-id").value = best.id;
      document.getElementById("deploy-best").disabled = !sweep.best_deployable;
      document.getElementById("deploy-note").classList.toggle("hidden", sweep.best_deployable);
    }
  }

  function render() {
    renderHeader();
    renderTrials();
    renderCurves();
    renderParallel();
  }

  render();
  let width = parallel.clientWidth;
  window.addEventListener("resize", () => {
    if (parallel.clientWidth !== width) {
      width = parallel.clientWidth;
      renderParallel();
    }
  });
  const liveUrl = () =>
    `/ui/api/sweeps/${encodeURIComponent(page.id)}` +
    (curveMetric !== state.sweep.metric ? `?metric=${encodeURIComponent(curveMetric)}` : "");
  const poller = Live.poll(liveUrl(), (data) => {
    state = data;
    render();
  });
  metricSelect.addEventListener("change", () => {
    curveMetric = metricSelect.value;
    saveChoices();
    chart.resetZoom(); // another metric: another y range (the next answer draws it)
    poller.setUrl(liveUrl());
  });
})();
