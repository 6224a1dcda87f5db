// The deployments list: the rows on screen follow their deployments live (state, reason, serving version,
// replicas), in place; newer deployments show a notice instead of moving the rows under the reader.
"use strict";

(() => {
  const table = document.getElementById("deployments");
  if (!table) return;
  const known = new Set([...table.querySelectorAll("tr[data-deployment-id]")].map((tr) => tr.dataset.deploymentId));
  const waiting = new Set(["QUEUED", "DEPLOYING", "UPDATING"]);
  const failed = new Set(["FAILED", "UNHEALTHY"]);

  Live.poll(table.dataset.liveUrl, (page) => {
    let newer = 0;
    for (const d of page.items) {
      const row = table.querySelector(`tr[data-deployment-id="${CSS.escape(d.id)}"]`);
      if (!row) {
        if (!known.has(d.id)) newer += 1;
        continue;
      }
      const badge = row.querySelector('[data-field="state"]');
      badge.textContent = d.state;
      badge.className = "badge state-" + d.state.toLowerCase();
      const why = row.querySelector('[data-field="why"]');
      why.className = "why" + (failed.has(d.state) ? " failed" : waiting.has(d.state) ? " waiting" : "");
      why.innerHTML = d.reason ? `<code>${App.escapeHtml(d.reason)}</code> ${App.escapeHtml(d.message)}` : "";
      row.querySelector('[data-field="serving"]').textContent =
        (d.serving_version ? `v${d.serving_version}` : "—") + (d.version !== d.serving_version ? ` → v${d.version}` : "");
      row.querySelector('[data-field="replicas"]').textContent = `${d.replicas_running} / ${d.replicas}`;
    }
    if (newer && table.dataset.firstPage === "true") document.getElementById("new-deployments").classList.remove("hidden");
  });
})();
