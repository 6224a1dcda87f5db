// The jobs list: the rows on screen follow their jobs live (state, reason, attempt, progress), in place;
// jobs newer than the first page's top show a notice instead of moving the rows under the reader.
"use strict";

(() => {
  const table = document.getElementById("jobs");
  if (!table) return;
  const known = new Set([...table.querySelectorAll("tr[data-job-id]")].map((tr) => tr.dataset.jobId));

  function setBadge(cell, state) {
    cell.textContent = state;
    cell.className = "badge state-" + state.toLowerCase();
  }

  Live.poll(table.dataset.liveUrl, (page) => {
    let newer = 0;
    for (const job of page.items) {
      const row = table.querySelector(`tr[data-job-id="${CSS.escape(job.id)}"]`);
      if (!row) {
        if (!known.has(job.id)) newer += 1;
        continue;
      }
      setBadge(row.querySelector('[data-field="state"]'), job.state);
      const why = row.querySelector('[data-field="why"]');
      why.className = "why " + job.why;
      why.innerHTML = job.reason ? `<code>${App.escapeHtml(job.reason)}</code> ${App.escapeHtml(job.message)}` : "";
      row.querySelector('[data-field="attempt"]').textContent = job.attempt;
      row.querySelector('[data-field="progress"]').textContent =
        job.epoch == null ? "" : `epoch ${job.epoch}, step ${job.step}`;
    }
    if (newer && table.dataset.firstPage === "true") document.getElementById("new-jobs").classList.remove("hidden");
  });
})();
