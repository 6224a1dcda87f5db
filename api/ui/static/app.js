// Shared by every dashboard page: small behaviours the templates ask for with data- attributes, and the
// CSRF header for the scripts' own POSTs. No inline script anywhere (the pages' CSP forbids it).
"use strict";

const App = (() => {
  const meta = (name) => (document.querySelector(`meta[name="${name}"]`) || {}).content || "";

  // Headers a script's POST needs: the session's CSRF token (the forms carry it as a hidden field).
  function csrfHeaders() {
    return { [meta("csrf-header") || "X-CSRF-Token"]: meta("csrf-token") };
  }

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { ...csrfHeaders(), "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
    });
    return response;
  }

  // The one escaper for what a script writes into HTML, as text and as an attribute's value (in " or '):
  // & < > " ' become character references, so a name or message can neither open a tag nor close the
  // attribute it sits in. (Reading back a div's innerHTML, as before, escaped no quotes.)
  const HTML_ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  function escapeHtml(value) {
    return (value == null ? "" : String(value)).replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]);
  }

  // Read JSON a template left for the page (<script type="application/json" id=...>: data, never run).
  function pageData(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function formatNumber(value) {
    if (value == null || value === "") return "";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString();
    const abs = Math.abs(value);
    return abs !== 0 && (abs < 1e-3 || abs >= 1e6) ? value.toExponential(2) : String(Number(value.toPrecision(4)));
  }

  document.addEventListener("DOMContentLoaded", () => {
    // <select data-autosubmit>: submit its form on change (the project switcher).
    document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
      select.addEventListener("change", () => select.form.submit());
    });
    // <form data-confirm="Cancel this job?">: ask first.
    document.querySelectorAll("form[data-confirm]").forEach((form) => {
      form.addEventListener("submit", (event) => {
        if (!window.confirm(form.dataset.confirm)) event.preventDefault();
      });
    });
    // <a data-back>: the browser's back, when there is somewhere to go back to.
    document.querySelectorAll("a[data-back]").forEach((link) => {
      link.addEventListener("click", (event) => {
        if (window.history.length > 1) {
          event.preventDefault();
          window.history.back();
        }
      });
    });
  });

  return { csrfHeaders, post, escapeHtml, pageData, formatNumber };
})();
