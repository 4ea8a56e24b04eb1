/* Live updates (htmx ws extension): whenever a session page's websocket opens — first time or after a
   reconnect — and whenever an HTTP swap replaced the history, tell the server which stored messages
   the page already has (#live-cursor), so it replays exactly the missed ones before live events. */
(function () {
  "use strict";
  var socket = null;
  var seen = null; // the #live-cursor element the server last knew about

  function resume() {
    var c = document.getElementById("live-cursor");
    if (!socket || !c) return;
    seen = c;
    socket.send(JSON.stringify({
      type: "resume",
      after: parseInt(c.dataset.lastId || "0", 10) || 0,
      order: c.dataset.order || "newest",
      tail: c.dataset.tail === "1",
      page: parseInt(c.dataset.page || "1", 10) || 1
    }));
  }

  function status(text) {
    var s = document.getElementById("live-status");
    if (s && !s.classList.contains("alert")) s.textContent = text;
  }

  document.addEventListener("htmx:wsOpen", function (evt) {
    socket = evt.detail.socketWrapper;
    document.body.dataset.live = "open";
    if (evt.target && evt.target.dataset.live === "session") resume();
  });
  document.addEventListener("htmx:wsClose", function () {
    document.body.dataset.live = "closed";
    status("Live updates: reconnecting…");
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    seen = document.getElementById("live-cursor"); // the server sent it: it knows
  });
  document.addEventListener("htmx:afterSettle", function () {
    var c = document.getElementById("live-cursor");
    if (c && c !== seen) resume(); // an HTTP response (page change, action) replaced the history
  });
})();
