// Websocket reconnects (htmx's ws extension). A connection the server closes with 1013, "try again later"
// (its channel layer, Redis, cannot be reached: sessions_app.live.LayerGuard), is tried again every 5–10 s:
// it opened before it closed, so htmx's own backoff would start from nothing each time. Otherwise htmx's
// "full-jitter" backoff as the extension has it (up to 2^retries seconds, at most 64).
(function () {
  "use strict";
  var layerDown = false;
  htmx.config.wsReconnectDelay = function (retries) {
    if (layerDown) return 5000 + 5000 * Math.random();
    return 1000 * Math.pow(2, Math.min(retries, 6)) * Math.random();
  };
  document.addEventListener("htmx:wsClose", function (e) {
    layerDown = !!(e.detail && e.detail.event && e.detail.event.code === 1013);
  });
  document.addEventListener("htmx:wsAfterMessage", function () { layerDown = false; });
})();
