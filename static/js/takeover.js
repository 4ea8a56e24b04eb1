/* Human takeover in the console.
   - The session page's reply composer: Enter sends, Shift+Enter starts a new line (IME composition is
     left alone), as in the live chat. Without JavaScript it is a plain form with a Send button.
   - The session list: an opt-in browser notification (Notification API) when a session starts waiting
     for a person. The button shows only where the browser supports notifications; nothing is asked
     before the operator clicks it. Rows arrive live over the list's websocket (data-mode on each row). */
(function () {
  "use strict";
  var KEY = "chatflow.notifyWaiting";

  document.addEventListener("keydown", function (e) {
    var box = e.target;
    if (!box || box.id !== "reply-text") return;
    if (e.key !== "Enter" || e.shiftKey || e.altKey || e.ctrlKey || e.metaKey || e.isComposing) return;
    e.preventDefault();
    var form = box.closest("form");
    if (form && box.value.trim()) form.requestSubmit();
  });

  // A live update re-renders the reply box (the mode or owner may have changed). The same box (same mode,
  // owner, composer) is left alone: replacing its form would drop the answer of a reply being sent (htmx
  // sends it to the detached form). The textarea itself is hx-preserve (below).
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var t = e.detail.target;
    if (!t || t.id !== "reply-box") return;
    var f = e.detail.fragment;
    var incoming = f && (f.id === "reply-box" ? f : (f.querySelector && f.querySelector("#reply-box")));
    if (incoming && incoming.dataset.state === t.dataset.state) e.detail.shouldSwap = false;
  });

  // A takeover form's answer (takeover_app's endpoints): on success the page re-reads its workspace (mode,
  // panel, composer, the new message with its delivery status); a refusal (400 / 409 naming the owner,
  // the 24-hour window) is shown beside the form that was sent.
  document.addEventListener("htmx:beforeSwap", function (e) {
    var elt = e.detail.requestConfig && e.detail.requestConfig.elt;
    var form = elt && elt.closest ? elt.closest("[data-takeover]") : null;
    if (!form) return;
    var status = e.detail.xhr.status;
    if (status >= 200 && status < 300) {
      e.detail.shouldSwap = false;
      done(form, e.detail.requestConfig);
      return;
    }
    var slot = form.dataset.errorTarget && document.querySelector(form.dataset.errorTarget);
    if (slot) e.detail.target = slot;
  });
  function done(form, requestConfig) {
    // The sent text leaves the box; what was typed after it while it was on its way stays, caret and all.
    var box = form.hasAttribute("data-composer") ? document.getElementById("reply-text") : null;
    var sent = box && requestConfig && requestConfig.formData ? requestConfig.formData.get("text") : null;
    if (box && typeof sent === "string" && box.value.indexOf(sent) === 0) box.setRangeText("", 0, sent.length);
    reread();
  }
  function reread() {
    var live = document.getElementById("live-session");
    if (live && live.dataset.panelUrl) {
      htmx.ajax("GET", live.dataset.panelUrl + "&order=" + currentOrder(), {target: "#session-panel", swap: "outerHTML"});
    }
  }
  // The action's own live update can come before its answer and replace the form that was sent (the
  // panel, the dialog). htmx then drops the answer: it looks for the answer's target from the detached
  // form and finds none, and nothing reaches the listener above. Such an answer is handled here once it
  // has loaded: the workspace is re-read, or the refusal shown in the form's error slot shown now.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var elt = e.detail.elt, xhr = e.detail.xhr, config = e.detail.requestConfig;
    var form = elt && elt.closest ? elt.closest("[data-takeover]") : null;
    if (!form || !xhr) return;
    // htmx's own handling of such an answer would throw ("Invalid re-target"); it is told to leave it. Its
    // events still reach the detached element itself, though not the document.
    function leave(ev) {
      if (ev.detail.xhr !== xhr) return;
      elt.removeEventListener("htmx:beforeOnLoad", leave);
      if (!document.contains(form)) ev.preventDefault();
    }
    elt.addEventListener("htmx:beforeOnLoad", leave);
    xhr.addEventListener("loadend", function () {
      elt.removeEventListener("htmx:beforeOnLoad", leave); // (no answer came: it never fired)
      if (document.contains(form) || !xhr.status) return; // htmx had it (above), or no answer came
      if (xhr.status >= 200 && xhr.status < 300) { done(form, config); return; }
      if (!/^40[039]$/.test(String(xhr.status))) return; // the refusals htmx would show (base.html's config)
      var slot = form.dataset.errorTarget && document.querySelector(form.dataset.errorTarget);
      if (slot) slot.innerHTML = xhr.responseText;
    });
  });
  // htmx.ajax resolves its target when called; a re-read queued behind another one (two actions in quick
  // succession: htmx runs them one after the other) would swap into the workspace the first one replaced.
  // It goes to the workspace shown now: a swap into a detached element would also take the preserved
  // composer (below) out of the page. Retargeted at beforeOnLoad, which fires on the request's source (the
  // body): beforeSwap fires on the old target, and a detached element's events never reach the document.
  document.addEventListener("htmx:beforeOnLoad", function (e) {
    var t = e.detail.target;
    var now = t && t.id === "session-panel" && !document.contains(t) ? document.getElementById("session-panel") : null;
    if (now) e.detail.target = now;
  });
  function currentOrder() {
    var c = document.getElementById("live-cursor");
    return (c && c.dataset.order) || "newest";
  }

  function rows() { return document.querySelectorAll("tr[data-row]"); }
  function waitingIds() {
    var out = {};
    [].forEach.call(rows(), function (r) { if (r.dataset.mode === "waiting") out[r.id] = true; });
    return out;
  }
  var known = null;

  function enabled() {
    return "Notification" in window && Notification.permission === "granted" && localStorage.getItem(KEY) === "on";
  }

  function label(button) {
    button.textContent = enabled() ? "Notifications on (click to turn off)" : "Notify me when a session waits for a person";
    button.setAttribute("aria-pressed", enabled() ? "true" : "false");
  }

  function setupList() {
    var button = document.getElementById("notify-optin");
    if (!button) return;
    known = waitingIds();
    if (!("Notification" in window)) return;
    button.hidden = false;
    label(button);
    button.addEventListener("click", function () {
      if (enabled()) { localStorage.setItem(KEY, "off"); label(button); return; }
      Notification.requestPermission().then(function (p) {
        localStorage.setItem(KEY, p === "granted" ? "on" : "off");
        label(button);
      });
    });
  }

  document.addEventListener("htmx:wsAfterMessage", function () {
    if (known === null) return;
    var now = waitingIds();
    Object.keys(now).forEach(function (id) {
      if (known[id] || !enabled()) return;
      var row = document.getElementById(id);
      var link = row && row.querySelector("td.sid a");
      var name = link ? link.textContent.trim() : "a session";
      var n = new Notification("A session waits for a person", {body: name, tag: id});
      n.onclick = function () { window.focus(); if (link) link.click(); };
    });
    known = now;
  });
  document.addEventListener("htmx:afterSettle", function () {
    if (known !== null) known = waitingIds(); // a filter or page change: what is shown now is known
  });

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setupList);
  else setupList();

  // The composer's textarea is hx-preserve with a stable id: every swap of the workspace or the reply box
  // (an action's answer, the re-read after it, a live update) keeps the live element, so keys typed while
  // a swap is on its way go where they always went, with the caret, selection and undo history. Where the
  // browser has Element.moveBefore, htmx moves it without losing the focus; elsewhere the move goes through
  // a detached fragment, which blurs it: the focus and selection come back as the swap ends (same task).
  var kept = null;
  function keep(e) {
    var box = document.getElementById("reply-text");
    if (e.detail.shouldSwap === false || !box || document.activeElement !== box) return;
    kept = {box: box, start: box.selectionStart, end: box.selectionEnd, dir: box.selectionDirection};
  }
  function refocus() {
    var k = kept;
    kept = null;
    if (!k || !document.contains(k.box) || document.activeElement === k.box) return;
    if (document.activeElement && document.activeElement !== document.body) return; // focus moved on purpose
    k.box.focus({preventScroll: true});
    k.box.setSelectionRange(k.start, k.end, k.dir);
  }
  document.addEventListener("htmx:beforeSwap", keep);
  document.addEventListener("htmx:oobBeforeSwap", keep);
  document.addEventListener("htmx:afterSwap", refocus);
  document.addEventListener("htmx:oobAfterSwap", refocus);
})();
