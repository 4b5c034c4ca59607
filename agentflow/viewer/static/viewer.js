// agentflow run viewer: the live refresh toggle and the confirmation before every action (Approve, Deny,
// Cancel, Retry, Decide, Fork).
// No framework and no build: the page works without this file (no refresh, no dialog).
"use strict";

// Ask before a form button with data-confirm submits (every action button has one).
document.addEventListener("submit", (event) => {
  const button = event.submitter;
  const message = button && button.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});

// Live refresh: fetch this page again and swap <main>, unless the user is typing in a form.
(() => {
  const toggle = document.getElementById("live-toggle");
  if (!toggle) return;
  const seconds = Number(document.body.dataset.refresh || "5");
  toggle.checked = localStorage.getItem("agentflow-live") !== "off";
  toggle.addEventListener("change", () => localStorage.setItem("agentflow-live", toggle.checked ? "on" : "off"));
  const busy = () => document.hidden || (document.activeElement && document.activeElement.closest("form"));
  setInterval(async () => {
    if (!toggle.checked || busy()) return;
    try {
      const response = await fetch(location.href, { headers: { "X-Requested-With": "refresh" } });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("live");
      const current = document.getElementById("live");
      if (fresh && current && !busy()) current.replaceWith(fresh);
    } catch (error) {
      // the viewer is restarting or the network dropped: try again next time
    }
  }, Math.max(2, seconds) * 1000);
})();
