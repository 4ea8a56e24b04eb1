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

  // A live update re-renders the reply box (the mode or owner may have changed): keep the draft and focus.
  // The same box (same mode, owner, composer) is left alone: replacing it would drop a reply being sent.
  var draft = null;
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var t = e.detail.target;
    if (!t || t.id !== "reply-box") return;
    var f = e.detail.fragment;
    var incoming = f && (f.id === "reply-box" ? f : (f.querySelector && f.querySelector("#reply-box")));
    if (incoming && incoming.dataset.state === t.dataset.state) { e.detail.shouldSwap = false; return; }
    var box = document.getElementById("reply-text");
    draft = box ? {value: box.value, focused: document.activeElement === box,
                   start: box.selectionStart, end: box.selectionEnd} : null;
  });
  document.addEventListener("htmx:oobAfterSwap", function (e) {
    var t = e.detail.target;
    if (!t || t.id !== "reply-box" || !draft) return;
    var box = document.getElementById("reply-text");
    if (box && draft.value) box.value = draft.value;
    if (box && draft.focused) { box.focus(); box.setSelectionRange(draft.start, draft.end); }
    draft = null;
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
      var live = document.getElementById("live-session");
      // The sent text leaves the box (a live update may have replaced the form meanwhile: the box now shown).
      var box = form.hasAttribute("data-composer") ? document.getElementById("reply-text") : null;
      if (box) box.value = "";
      if (live && live.dataset.panelUrl) {
        htmx.ajax("GET", live.dataset.panelUrl + "&order=" + currentOrder(), {target: "#session-panel", swap: "outerHTML"});
      }
      return;
    }
    var slot = form.dataset.errorTarget && document.querySelector(form.dataset.errorTarget);
    if (slot) e.detail.target = slot;
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

  // The page re-reads its workspace after a takeover action (#session-panel, above): a reply being typed
  // meanwhile stays in the new box, with its focus and selection. Restored as the swap ends (afterSwap, the
  // same task as the swap), not at settle: keys typed in the settle delay go into the new box, which then
  // was no longer empty, and the draft (the reply's first words) was dropped.
  var panelDraft = null;
  document.addEventListener("htmx:beforeSwap", function (e) {
    var t = e.detail.target;
    var box = document.getElementById("reply-text");
    if (e.detail.shouldSwap === false || !t || !box || !(t === box || t.contains(box))) return;
    panelDraft = box.value ? {value: box.value, focused: document.activeElement === box,
                              start: box.selectionStart, end: box.selectionEnd} : null;
  });
  document.addEventListener("htmx:afterSwap", function () {
    if (!panelDraft) return;
    var d = panelDraft, box = document.getElementById("reply-text");
    panelDraft = null;
    if (!box || box.value) return;
    box.value = d.value;
    if (d.focused) { box.focus(); box.setSelectionRange(d.start, d.end); }
  });
})();
