/* Live chat page: clear the message box once the websocket took the message; show the socket's state. */
(function () {
  "use strict";
  function status(text) {
    var s = document.getElementById("chat-status");
    if (s) s.textContent = text;
  }
  document.addEventListener("htmx:wsOpen", function () { status("Connected."); document.body.dataset.live = "open"; });
  document.addEventListener("htmx:wsClose", function () { status("Disconnected: reconnecting…"); document.body.dataset.live = "closed"; });
  document.addEventListener("htmx:wsAfterSend", function () {
    var box = document.getElementById("c-message");
    if (box) { box.value = ""; box.focus(); }
  });
})();
