// A job's page: live state, timeline, checkpoints, curves and logs, each updated in place from the
// /ui/api/jobs/{id}... JSON (Live.poll), so a zoomed chart, a search or a scrolled log stays as the user left it.
"use strict";

(() => {
  const page = App.pageData("page-data");
  const base = `/ui/api/jobs/${encodeURIComponent(page.id)}`;
  const $ = (id) => document.getElementById(id);
  let attempt = page.attempt;

  // --- state, timeline, checkpoints -------------------------------------------------------------------
  function badge(state) {
    return `<span class="badge state-${App.escapeHtml(state.toLowerCase())}">${App.escapeHtml(state)}</span>`;
  }

  function onSummary(summary) {
    const job = summary.job;
    const state = $("job-state");
    state.textContent = job.state;
    state.className = "badge state-" + job.state.toLowerCase();
    const reason = $("job-reason");
    reason.className = `reason ${job.why} ${job.reason ? "" : "hidden"}`;
    reason.querySelector('[data-field="reason"]').textContent = job.reason;
    reason.querySelector('[data-field="message"]').textContent = job.message;
    $("job-attempt").textContent = job.attempt;
    $("job-progress").textContent = job.epoch == null ? "" : `epoch ${job.epoch}, step ${job.step}`;
    $("samples-per-s").textContent = job.samples_per_s == null ? "—" : App.formatNumber(job.samples_per_s);
    $("job-started").textContent = (job.started_at || "").replace("T", " ").slice(0, 19);
    $("job-finished").textContent = (job.finished_at || "").replace("T", " ").slice(0, 19);
    if (job.terminal) {
      const cancel = $("cancel-form");
      if (cancel) cancel.classList.add("hidden");
      document.querySelectorAll(".deploy-form button").forEach((b) => {
        b.disabled = false;
        b.removeAttribute("title");
      });
      if ($("deploy-hint")) $("deploy-hint").classList.add("hidden");
    }
    renderTimeline(summary.events);
    renderCheckpoints(summary.checkpoints, job.terminal);
    if (job.attempt > attempt) newAttempt(job.attempt);
  }

  function renderTimeline(events) {
    const list = $("timeline");
    for (let i = list.children.length; i < events.length; i++) {
      const e = events[i];
      const li = document.createElement("li");
      li.innerHTML =
        `<span class="when">${App.escapeHtml(e.created_at.replace("T", " ").slice(0, 19))}</span> ${badge(e.to_state)} ` +
        (e.attempt ? `<span class="muted">attempt ${e.attempt}</span> ` : "") +
        (e.reason ? `<code>${App.escapeHtml(e.reason)}</code> ` : "") +
        `<span class="message">${App.escapeHtml(e.message)}</span>`;
      list.appendChild(li);
    }
  }

  function renderCheckpoints(checkpoints, terminal) {
    const body = $("checkpoints").tBodies[0];
    const empty = body.querySelector("tr.empty");
    if (checkpoints.length && empty) empty.remove();
    const shown = new Set([...body.rows].map((r) => r.dataset.checkpointId));
    for (const c of checkpoints) {
      if (shown.has(String(c.id))) continue;
      const row = body.insertRow();
      row.dataset.checkpointId = c.id;
      const metrics = Object.entries(c.metrics).map(([k, v]) => `${k}=${v}`).join(" ");
      row.innerHTML =
        `<td class="num">${c.step}</td><td class="num">${c.epoch}</td><td class="num">${c.attempt}</td>` +
        `<td class="mono">${App.escapeHtml(metrics)}</td><td class="num">${(c.size_bytes / 1e6).toFixed(2)} MB</td>`;
      if (page.can_write) {
        const template = document.querySelector(".deploy-form");
        const name = template ? template.querySelector("input[name=name]").value.replace(/-\d+$/, "") : "job";
        const cell = row.insertCell();
        const csrf = App.csrfHeaders();
        cell.innerHTML =
          `<form method="post" action="/ui/jobs/${encodeURIComponent(page.id)}/checkpoints/${c.id}/deploy" class="deploy-form">` +
          `<input type="hidden" name="csrf_token" value="${App.escapeHtml(Object.values(csrf)[0])}">` +
          `<input type="text" name="name" value="${App.escapeHtml(name)}-${c.id}" maxlength="63" required aria-label="deployment name">` +
          `<button type="submit" class="primary" ${terminal ? "" : "disabled"}>Deploy</button></form>`;
      }
    }
    for (const c of checkpoints) {
      const row = body.querySelector(`tr[data-checkpoint-id="${c.id}"]`);
      row.classList.toggle("best", c.best);
      const mark = row.querySelector("[data-best]");
      if (c.best && !mark) row.cells[0].insertAdjacentHTML("beforeend", ' <span class="badge state-succeeded" data-best>best</span>');
      if (!c.best && mark) mark.remove();
    }
  }

  Live.poll(base, onSummary);

  // --- curves -------------------------------------------------------------------------------------------
  const charts = {}; // title -> Charts.line
  const chartOptions = { log: false, smoothing: 0 };
  const metricsUrl = () => `${base}/metrics?x=${$("x-axis").value}&points=${page.points}`;

  function onMetrics(data) {
    $("no-metrics").classList.toggle("hidden", data.charts.length > 0);
    $("points-info").textContent = data.points
      ? `${data.points.toLocaleString()} points` + (data.shown < data.points ? `, ${data.shown.toLocaleString()} drawn (extremes kept)` : "")
      : "";
    const attempts = new Set(data.charts.flatMap((c) => c.series.map((s) => s.attempt)));
    for (const chart of data.charts) {
      if (!charts[chart.title]) {
        const element = document.createElement("div");
        element.className = "chart";
        element.dataset.chart = chart.title;
        $("charts").appendChild(element);
        charts[chart.title] = Charts.line(element, { title: chart.title, xLabel: data.x_axis, time: data.x_axis === "time" });
        charts[chart.title].setOptions(chartOptions);
      }
      charts[chart.title].update({
        x: chart.x,
        series: chart.series.map((s) => ({
          label: attempts.size > 1 ? `${s.metric} (attempt ${s.attempt})` : s.metric,
          group: s.metric,
          dash: s.attempt % 2 === 0 ? [6, 3] : undefined,
          y: s.y,
        })),
        markers: data.restarts.map((r) => ({ x: r.x, label: `attempt ${r.attempt}` })),
      });
    }
  }

  const metricsPoller = Live.poll(metricsUrl(), onMetrics, { intervalMs: 4000 }); // a new answer reads every point
  $("x-axis").addEventListener("change", () => {
    for (const title of Object.keys(charts)) delete charts[title];
    $("charts").querySelectorAll(".chart").forEach((node) => node.remove());
    metricsPoller.setUrl(metricsUrl());
  });
  $("log-scale").addEventListener("change", (event) => {
    chartOptions.log = event.target.checked;
    Object.values(charts).forEach((c) => c.setOptions({ log: chartOptions.log }));
  });
  $("smoothing").addEventListener("input", (event) => {
    chartOptions.smoothing = Number(event.target.value);
    $("smoothing-value").textContent = event.target.value;
    Object.values(charts).forEach((c) => c.setOptions({ smoothing: chartOptions.smoothing }));
  });

  // --- logs ---------------------------------------------------------------------------------------------
  const logs = $("logs");
  const MAX_SHOWN = 20000; // lines kept on screen; the download has them all
  let logPoller = null;
  let next = null;

  function atBottom() {
    return logs.scrollHeight - logs.scrollTop - logs.clientHeight < 40;
  }

  function appendLines(lines, query) {
    const stick = atBottom();
    const fragment = document.createDocumentFragment();
    for (const [, text] of lines) {
      const line = document.createElement("div");
      if (query) {
        const at = text.toLowerCase().indexOf(query.toLowerCase());
        line.append(text.slice(0, at));
        const mark = document.createElement("mark");
        mark.textContent = text.slice(at, at + query.length);
        line.append(mark, text.slice(at + query.length));
      } else {
        line.textContent = text;
      }
      fragment.appendChild(line);
    }
    logs.appendChild(fragment);
    while (logs.childElementCount > MAX_SHOWN) logs.firstElementChild.remove();
    if (stick && $("log-follow").checked) logs.scrollTop = logs.scrollHeight;
  }

  function logUrl() {
    const selected = $("log-attempt").value;
    return next == null ? `${base}/logs?attempt=${selected}` : `${base}/logs?attempt=${selected}&after=${next}`;
  }

  let generation = 0; // a poller replaced while its request was out must not append to the new view

  function tail() {
    if (logPoller) logPoller.stop();
    const mine = ++generation;
    logPoller = Live.poll(logUrl(), (data) => mine === generation && onLogs(data));
  }

  function onLogs(data) {
    if (next == null || data.reset) logs.textContent = "";
    appendLines(data.lines);
    next = data.next;
    $("log-info").textContent = `${data.total.toLocaleString()} lines`;
    if (!$("log-follow").checked) {
      logPoller.stop(); // not following: the tail was loaded once
      logPoller = null;
    } else {
      logPoller.setUrl(logUrl());
    }
  }

  function stopTail() {
    generation += 1;
    if (logPoller) logPoller.stop();
    logPoller = null;
  }

  function startTail() {
    stopTail();
    next = null;
    if (!$("log-attempt").value) return;
    $("log-download").href = `/ui/jobs/${encodeURIComponent(page.id)}/logs/download?attempt=${$("log-attempt").value}`;
    if ($("log-search").value.trim()) return search();
    tail();
  }

  let searchTimer = null;
  async function search() {
    const query = $("log-search").value.trim();
    if (!query) return startTail();
    stopTail();
    const mine = generation;
    const response = await fetch(`${base}/logs?attempt=${$("log-attempt").value}&q=${encodeURIComponent(query)}`, {
      credentials: "same-origin",
    });
    if (!response.ok) return;
    const data = await response.json();
    if (mine !== generation) return; // another search or attempt since
    logs.textContent = "";
    appendLines(data.lines, query);
    $("log-info").textContent = `${data.matches.toLocaleString()} of ${data.total.toLocaleString()} lines match`;
  }

  function newAttempt(latest) {
    const select = $("log-attempt");
    const wasLatest = select.value === String(attempt) || !select.value;
    for (let a = attempt + 1; a <= latest; a++) {
      const option = document.createElement("option");
      option.value = option.textContent = String(a);
      select.insertBefore(option, select.firstChild);
    }
    attempt = latest;
    if (wasLatest) {
      select.value = String(latest);
      startTail();
    }
  }

  $("log-attempt").addEventListener("change", startTail);
  $("log-search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(search, 300);
  });
  $("log-follow").addEventListener("change", (event) => {
    if (event.target.checked && !$("log-search").value.trim()) {
      tail(); // from the last line shown on
      logs.scrollTop = logs.scrollHeight;
    } else {
      stopTail();
    }
  });
  startTail();
})();
