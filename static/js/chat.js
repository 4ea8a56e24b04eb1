/* Live chat page (templates/agents_app/chat.html).
   - The socket's state in #chat-status (body[data-live] = open | closed).
   - Enter sends, Shift+Enter starts a new line (IME composition is left alone).
   - A message goes to the session the "Session id" field shows, as typed (the server refuses an id it cannot
     store as typed), also when it was typed without "Open": never to the id the page was opened with.
   - Each sent message is numbered (seq); the server answers with #chat-ack: "accepted" (it became a turn)
     empties the box if it still holds that text, "refused" puts it back if the box was emptied meanwhile.
   - The page follows the newest message while the reader is at the bottom; a reader who scrolled up
     stays where they are and gets a "New messages" pill that scrolls back down. */
(function () {
  "use strict";
  var SLACK = 48; // px above the bottom that still count as "reading the newest message"
  var follow = true;
  var seq = 0;
  var pending = {};
  var heightBefore = 0;

  function el(id) { return document.getElementById(id); }
  function status(text) { var s = el("chat-status"); if (s) s.textContent = text; }
  function page() { return document.documentElement; }
  function atBottom() { return page().scrollHeight - (window.scrollY + window.innerHeight) <= SLACK; }
  function pill(show) { var p = el("chat-new-messages"); if (p) p.hidden = !show; }
  function toBottom() {
    window.scrollTo(0, page().scrollHeight);
    follow = true;
    pill(false);
  }

  window.addEventListener("scroll", function () {
    follow = atBottom();
    if (follow) pill(false);
  }, { passive: true });

  document.addEventListener("htmx:wsOpen", function () { status("Connected."); document.body.dataset.live = "open"; });
  document.addEventListener("htmx:wsClose", function (e) {
    var code = e.detail && e.detail.event ? e.detail.event.code : 0;
    status(code === 4401 ? "Disconnected: you are logged out. Reload the page to log in again." :
           code === 4403 ? "Disconnected: your account no longer has permission to play turns here." :
           code === 1013 ? "Disconnected: the server cannot reach its channel layer (Redis), so the chat cannot " +
                           "run. Retrying…" : "Disconnected: reconnecting…");
    document.body.dataset.live = "closed";
  });

  document.addEventListener("htmx:wsConfigSend", function (e) {
    var field = el("c-session");
    var target = document.querySelector('#chat-form input[name="session_id"]');
    if (field) {
      e.detail.parameters.session_id = field.value;
      if (target) target.value = field.value;
    }
    seq += 1;
    e.detail.parameters.seq = String(seq);
    pending[seq] = e.detail.parameters.message || "";
    follow = true; // the sender wants to see their message and its answer
  });

  document.addEventListener("htmx:wsBeforeMessage", function () { heightBefore = page().scrollHeight; });
  document.addEventListener("htmx:wsAfterMessage", function () {
    acknowledge();
    if (follow) toBottom();
    else if (page().scrollHeight > heightBefore) pill(true);
  });

  function acknowledge() {
    var ack = el("chat-ack");
    var box = el("c-message");
    if (!ack || !box || !ack.dataset.seq || !(ack.dataset.seq in pending)) return;
    var text = pending[ack.dataset.seq];
    delete pending[ack.dataset.seq];
    if (ack.dataset.outcome === "accepted") {
      if (box.value === text) box.value = "";
    } else if (box.value === "") {
      box.value = text; // refused: the text stays the reader's to edit or copy
    }
    box.focus();
  }

  function start() {
    var box = el("c-message");
    var form = el("chat-form");
    var more = el("chat-new-messages");
    if (more) more.addEventListener("click", function () { toBottom(); if (box) box.focus(); });
    if (box && form) {
      box.addEventListener("keydown", function (e) {
        if (e.key !== "Enter" || e.shiftKey || e.altKey || e.ctrlKey || e.metaKey || e.isComposing) return;
        e.preventDefault();
        if (box.value.trim() && !box.disabled) form.requestSubmit();
      });
      if (!box.disabled) box.focus({ preventScroll: true });
    }
    toBottom(); // an existing session opens at its newest message
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
