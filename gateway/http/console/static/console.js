// Progressive enhancement only: every page works without it.
// The overview's live part follows the daemon over server-sent events; a form that asks
// for confirmation (data-confirm) asks before it is sent.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  if (live && window.EventSource) {
    const events = new EventSource(live.dataset.src);
    events.addEventListener("overview", (event) => {
      live.innerHTML = event.data; // server-rendered, escaped HTML from our own origin
      document.body.dataset.live = "on";
    });
    events.addEventListener("error", () => { document.body.dataset.live = "off"; });
  }
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
});
