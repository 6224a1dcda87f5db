// A deployment's page: its state, replicas, versions and history follow the deployment live (Live.poll, in
// place); the rollback form is the server's (a POST with the CSRF field); "try it" posts to the control plane,
// which calls the deployment and hands back its answer, shown as it came (status and body), errors plainly.
"use strict";

(() => {
  const page = App.pageData("page-data");
  if (!page) return;
  const esc = App.escapeHtml;
  const time = (iso) => (iso ? iso.slice(0, 19).replace("T", " ") : "");

  function badge(state, extra) {
    return `<span class="badge state-${esc(String(state).toLowerCase())}"${extra || ""}>${esc(state)}</span>`;
  }

  function render(data) {
    const d = data.deployment;
    const stateBadge = document.getElementById("deployment-state");
    stateBadge.textContent = d.state;
    stateBadge.className = "badge state-" + d.state.toLowerCase();
    const reason = document.getElementById("deployment-reason");
    reason.classList.toggle("hidden", !d.reason);
    reason.classList.toggle("waiting", ["QUEUED", "DEPLOYING", "UPDATING"].includes(d.state));
    reason.querySelector('[data-field="reason"]').textContent = d.reason;
    reason.querySelector('[data-field="message"]').textContent = d.message;
    document.getElementById("serving-version").textContent = d.serving_version ? `v${d.serving_version}` : "nothing yet";
    document.getElementById("target-version").textContent = `v${d.version}`;
    document.getElementById("serve-status").innerHTML =
      esc(d.serve_status || "—") + (d.observed_at ? ` <span class="muted">at ${esc(time(d.observed_at))}</span>` : "");

    const rollback = document.getElementById("rollback-form");
    if (rollback) {
      rollback.classList.toggle("hidden", !data.can_roll_back);
      document.getElementById("rollback-to").textContent = d.version - 1;
      rollback.dataset.confirm = `Roll ${d.name} back to the version before v${d.version}?`;
    }

    const replicas = document.querySelector("#replicas tbody");
    replicas.innerHTML = d.replicas.length
      ? d.replicas
          .map((r) => `<tr data-replica-id="${esc(r.replica_id)}"><td class="mono">${esc(r.replica_id)}</td><td>${badge(r.state)}</td></tr>`)
          .join("")
      : `<tr class="empty"><td colspan="2" class="muted">No replica reported${d.observed_at ? "" : " yet"}.</td></tr>`;

    document.querySelector("#versions tbody").innerHTML = data.versions
      .map((v) => {
        const serving = v.version === d.serving_version;
        const marks =
          (serving ? ' <span class="badge state-healthy" data-testid="serving">serving</span>' : "") +
          (v.version === d.version && !serving
            ? ` <span class="badge state-updating" data-testid="rolling-out">${data.deleted ? "newest" : "rolling out"}</span>`
            : "");
        const origin = v.origin.href ? `<a href="${esc(v.origin.href)}">${esc(v.origin.label)}</a>` : esc(v.origin.label);
        const metrics = Object.entries(v.metrics)
          .map(([k, value]) => `${esc(k)}=${esc(App.formatNumber(value))}`)
          .join(" ");
        return `<tr data-version="${v.version}" class="${serving ? "best" : ""}">
          <td>v${v.version}${marks}</td>
          <td>${origin}<br><span class="muted mono path">${esc(v.checkpoint_path)}</span></td>
          <td class="num">${esc(v.epoch == null ? "" : v.epoch)} / ${esc(v.step == null ? "" : v.step)}</td>
          <td class="mono">${metrics}</td>
          <td class="num">${esc(v.replicas_text)}</td>
          <td>${esc(v.note)}</td>
          <td>${esc(time(v.created_at))}</td></tr>`;
      })
      .join("");

    const history = document.getElementById("history");
    const scroll = history.scrollTop;
    history.innerHTML = data.events
      .map(
        (e) => `<li><span class="when">${esc(time(e.created_at))}</span> ${badge(e.to_state)}
          <span class="muted">v${e.version}</span> ${e.reason ? `<code>${esc(e.reason)}</code>` : ""} ${esc(e.message)}</li>`,
      )
      .join("");
    history.scrollTop = scroll;
  }

  Live.poll(`/ui/api/deployments/${encodeURIComponent(page.id)}`, render);

  // --- try it ------------------------------------------------------------------------------------------------
  const form = document.getElementById("try-form");
  if (!form) return;
  const status = document.getElementById("try-status");
  const answer = document.getElementById("try-answer");
  const body = document.getElementById("try-body");
  document.getElementById("try-method").addEventListener("change", (event) => {
    body.disabled = event.target.value === "GET";
  });

  function show(ok, line, content) {
    status.className = ok ? "notice" : "error";
    status.textContent = line;
    answer.classList.toggle("hidden", content == null);
    answer.textContent = content == null ? "" : typeof content === "string" ? content : JSON.stringify(content, null, 2);
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = document.getElementById("try-send");
    button.disabled = true;
    status.className = "muted";
    status.textContent = "Sending…";
    const key = document.getElementById("try-key");
    try {
      const response = await App.post(form.dataset.url, {
        method: document.getElementById("try-method").value,
        body: body.value,
        key: key ? key.value : null,
      });
      const data = await response.json().catch(() => ({ detail: `the control plane answered ${response.status}` }));
      if (response.status === 401 && !data.status) {
        window.location.href = "/ui/login?next=" + encodeURIComponent(location.pathname);
        return;
      }
      if (!response.ok) {
        // The control plane's own refusal (a body that is not JSON, a deployment it could not reach...).
        const detail = Array.isArray(data.detail) ? data.detail.map((e) => e.msg).join("; ") : data.detail;
        show(false, `Not sent or not answered (${response.status}): ${detail}`, null);
        return;
      }
      const line = `${data.method} ${data.url} → ${data.status} in ${data.elapsed_ms} ms${data.truncated ? " (answer cut)" : ""}`;
      const hint =
        data.status === 401 ? " — this deployment needs a key of its project: fill in the key field." : "";
      show(data.ok, line + hint, data.answer);
    } catch (error) {
      show(false, `The request failed: ${error}`, null);
    } finally {
      button.disabled = false;
    }
  });
})();
