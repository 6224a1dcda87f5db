// The sweeps list: the rows on screen follow their sweeps live (state, reason, trials, best), in place; sweeps
// newer than the first page's top show a notice instead of moving the rows under the reader.
"use strict";

(() => {
  const table = document.getElementById("sweeps");
  if (!table) return;
  const known = new Set([...table.querySelectorAll("tr[data-sweep-id]")].map((tr) => tr.dataset.sweepId));

  Live.poll(table.dataset.liveUrl, (page) => {
    let newer = 0;
    for (const sweep of page.items) {
      const row = table.querySelector(`tr[data-sweep-id="${CSS.escape(sweep.id)}"]`);
      if (!row) {
        if (!known.has(sweep.id)) newer += 1;
        continue;
      }
      const badge = row.querySelector('[data-field="state"]');
      badge.textContent = sweep.state;
      badge.className = "badge state-" + sweep.state.toLowerCase();
      const why = row.querySelector('[data-field="why"]');
      why.className = "why" + (sweep.state === "FAILED" ? " failed" : sweep.state === "QUEUED" ? " waiting" : "");
      why.innerHTML = sweep.reason
        ? `<code>${App.escapeHtml(sweep.reason)}</code> ${App.escapeHtml(sweep.message)}`
        : "";
      const seen = Object.values(sweep.trials).reduce((a, b) => a + b, 0);
      row.querySelector('[data-field="trials"]').textContent = `${seen} / ${sweep.total_trials}`;
      row.querySelector('[data-field="best"]').textContent = sweep.best == null ? "" : App.formatNumber(sweep.best);
    }
    if (newer && table.dataset.firstPage === "true") document.getElementById("new-sweeps").classList.remove("hidden");
  });
})();
