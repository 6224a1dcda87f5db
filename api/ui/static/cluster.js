// The cluster page: resources, nodes, job counts and the queue follow the cluster live (Live.poll), in place.
"use strict";

(() => {
  const esc = App.escapeHtml;
  const time = (iso) => (iso ? iso.slice(0, 19).replace("T", " ") : "");
  const num = (v) => App.formatNumber(Math.round(v * 1000) / 1000);

  function why(item) {
    return item.reason
      ? `<code>${esc(item.reason)}</code> ${esc(item.message)}`
      : '<span class="muted">not looked at yet</span>';
  }

  function placement(node) {
    return node.kept_out
      ? `<span class="error">kept out until <time datetime="${esc(node.kept_out)}">${esc(time(node.kept_out))}</time>
          (${node.faults} hangs or stragglers)</span>`
      : '<span class="muted">placed on</span>';
  }

  function render(c) {
    document.getElementById("ray-unavailable").classList.toggle("hidden", c.ray === "ok");
    for (const r of c.resources) {
      const row = document.querySelector(`#resources tr[data-resource="${CSS.escape(r.name)}"]`);
      if (!row) continue;
      row.querySelector('[data-field="total"]').textContent = num(r.total);
      row.querySelector('[data-field="used"]').textContent = num(r.used);
      row.querySelector('[data-field="free"]').textContent = num(r.free);
    }
    const counts = Object.entries(c.jobs).filter(([, n]) => n);
    document.getElementById("job-counts").innerHTML = counts.length
      ? counts.map(([s, n]) => `<span class="badge state-${esc(s.toLowerCase())}">${esc(s.toLowerCase())} ${n}</span>`).join(" ")
      : '<span class="muted">none</span>';
    document.querySelector("#nodes tbody").innerHTML = c.nodes.length
      ? c.nodes
          .map(
            (n) => `<tr data-node-id="${esc(n.node_id)}"><td class="mono">${esc(n.cluster)}</td><td class="mono">${esc(n.node_id.slice(0, 16))}</td>
              <td class="mono">${esc(n.address)}</td><td>${n.is_head ? "head" : "worker"}</td>
              <td class="num">${num(n.total.CPU || 0)}</td><td class="num">${num(n.total.GPU || 0)}</td>
              <td data-field="placement">${placement(n)}</td></tr>`,
          )
          .join("")
      : '<tr class="empty"><td colspan="7" class="muted">No node to show.</td></tr>';
    const projectCell = (item) => (c.all_projects ? `<td class="mono">${esc(item.project_id)}</td>` : "");
    const width = c.all_projects ? 6 : 5;
    document.querySelector("#queue tbody").innerHTML = c.queue.length
      ? c.queue
          .map(
            (j, i) => `<tr data-job-id="${esc(j.id)}"><td class="num">${i + 1}</td>
              <td><a href="/ui/jobs/${encodeURIComponent(j.id)}">${esc(j.name || j.id)}</a></td>${projectCell(j)}
              <td class="num">${j.priority}</td><td><div class="why waiting" data-field="why">${why(j)}</div></td>
              <td>${esc(time(j.created_at))}</td></tr>`,
          )
          .join("")
      : `<tr class="empty"><td colspan="${width}" class="muted">No job waits.</td></tr>`;
    const queued = c.jobs.QUEUED || 0;
    document.getElementById("queue-more").textContent =
      queued > c.queue.length ? `Showing the first ${c.queue.length} of ${queued} queued jobs.` : "";
    document.querySelector("#queued-sweeps tbody").innerHTML = c.queued_sweeps.length
      ? c.queued_sweeps
          .map(
            (s) => `<tr data-sweep-id="${esc(s.id)}"><td><a href="/ui/sweeps/${encodeURIComponent(s.id)}">${esc(s.name || s.id)}</a></td>
              ${projectCell(s)}<td class="num">${s.priority}</td><td><div class="why waiting">${s.reason ? why(s) : ""}</div></td>
              <td>${esc(time(s.created_at))}</td></tr>`,
          )
          .join("")
      : `<tr class="empty"><td colspan="${width - 1}" class="muted">No sweep waits.</td></tr>`;
  }

  Live.poll("/ui/api/cluster", render);
})();
