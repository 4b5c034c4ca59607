// agentflow run viewer: the live refresh toggle, the run page's live events (an EventSource on
// /runs/RUN_ID/events), and the confirmation before every action (Approve, Deny, Cancel, Retry, Decide, Fork).
// Everything shown is built with textContent, never innerHTML.
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
      if (!fresh || !current || busy()) return;
      // The live events list stays as it is: it is fed by its own stream, not by the page.
      const events = current.querySelector("#live-events");
      const slot = fresh.querySelector("#live-events");
      if (events && slot) slot.replaceWith(events);
      current.replaceWith(fresh);
    } catch (error) {
      // the viewer is restarting or the network dropped: try again next time
    }
  }, Math.max(2, seconds) * 1000);
})();


// Live events: follow the run's event stream and add each event to the list, newest last.
// The browser reconnects by itself after a break, sending the last event id (none is repeated);
// the server's "end" event means the run has ended and everything is shown.
(() => {
  const section = document.getElementById("live-events");
  if (!section || !window.EventSource) return;
  const list = section.querySelector(".event-list");
  const state = section.querySelector(".events-state");
  const KEEP = 500; // the most events the list shows (the oldest go first)
  const source = new EventSource(section.dataset.src);
  const say = (text) => { state.textContent = text; };
  say("Following the run…");

  const add = (className, parts) => {
    if (!section.isConnected) {
      source.close();
      return;
    }
    const item = document.createElement("li");
    item.className = className;
    for (const [tag, cls, text] of parts) {
      const node = document.createElement(tag);
      node.className = cls;
      node.textContent = text;
      item.appendChild(node);
    }
    list.appendChild(item);
    while (list.children.length > KEEP) list.removeChild(list.firstChild);
    list.scrollTop = list.scrollHeight;
  };
  const fields = (data) =>
    Object.entries(data || {})
      .map(([key, value]) => `${key}=${typeof value === "string" ? value : JSON.stringify(value)}`)
      .join(" ");
  const show = (message) => {
    let body;
    try {
      body = JSON.parse(message.data);
    } catch (error) {
      return;
    }
    const at = typeof body.at === "number" ? new Date(body.at * 1000).toLocaleTimeString() : "";
    add("event", [["span", "at", at], ["code", "name", String(body.name)], ["span", "fields", fields(body.data)]]);
  };
  for (const name of (section.dataset.names || "").split(" ").filter(Boolean)) {
    source.addEventListener(name, show);
  }
  source.onmessage = show;
  source.addEventListener("problem", (message) => {
    let text = "an event that does not check";
    try {
      text = String(JSON.parse(message.data).problem);
    } catch (error) {
      // keep the general words
    }
    add("problem", [["span", "name", "problem"], ["span", "fields", text]]);
  });
  source.addEventListener("end", () => {
    source.close();
    say("The run has ended: every event is shown.");
  });
  source.onopen = () => say("Following the run…");
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) say("The events cannot be followed (reload the page to try again).");
    else say("Reconnecting…");
  };
})();
