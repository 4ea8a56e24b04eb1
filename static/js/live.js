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
  // Closed for good (no reconnect): the login the page was opened with is gone, or its permission.
  var STOPPED = {
    4401: "Live updates stopped: you are logged out. Reload the page to log in again.",
    4403: "Live updates stopped: your account no longer has permission to see them."
  };

  function stopped(where, text) {
    if (document.getElementById("live-status")) { status(text); return; }
    var note = document.getElementById("live-stopped"); // the list has no status line: a note above it
    if (!note && where && where.parentNode) {
      note = document.createElement("p");
      note.id = "live-stopped";
      note.className = "note error";
      note.setAttribute("role", "status");
      where.parentNode.insertBefore(note, where);
    }
    if (note) note.textContent = text;
  }

  document.addEventListener("htmx:wsClose", function (e) {
    document.body.dataset.live = "closed";
    var code = e.detail && e.detail.event ? e.detail.event.code : 0;
    if (code === 4404 && e.target && e.target.dataset && e.target.dataset.live === "session") {
      gone(); // the session does not exist (any more): the server refused its socket, which is not retried
      return;
    }
    if (STOPPED[code]) { stopped(e.target, STOPPED[code]); return; }
    status(code === 1013 ? "Live updates unavailable: the server cannot reach its channel layer (Redis). Retrying…"
                         : "Live updates: reconnecting…");
  });

  // The page says the session was deleted, as the live "deleted" notice does; the workspace then disables
  // every action (below).
  function gone() {
    var s = document.getElementById("live-status");
    if (!s || s.dataset.gone) return;
    s.className = "live-status card alert error";
    s.setAttribute("role", "alert");
    s.dataset.gone = "1";
    s.textContent = "";
    var strong = document.createElement("strong");
    strong.textContent = "Deleted:";
    s.appendChild(strong);
    s.appendChild(document.createTextNode(" this session no longer exists. What this page shows is no longer " +
                                          "stored; its actions are disabled."));
  }

  // A page restored from the browser's back/forward cache shows what it held when it was left (the session
  // may have been deleted since): it is loaded again.
  window.addEventListener("pageshow", function (e) {
    if (e.persisted && document.getElementById("live-session")) location.reload();
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    seen = document.getElementById("live-cursor"); // the server sent it: it knows
  });
  document.addEventListener("htmx:afterSettle", function () {
    var c = document.getElementById("live-cursor");
    if (c && c !== seen) resume(); // an HTTP response (page change, action) replaced the history
  });
})();

/* The session page's workspace: the conversation opens at its end, the inspector remembers whether it
   is shown, dialogs are modal (focus moves in, stays in, returns on close), find-in-session, copy id,
   and a live "deleted" notice disables every action. Without JavaScript all of it is plain pages. */
(function () {
  "use strict";
  var KEY = "chatflow.inspector";
  var opener = null;
  var upgrading = false; // a full page's open dialog being made modal: its close is not the reader's
  var opened = 0; // dialogs opened so far
  var asked = new WeakMap(); // a request for the workspace → dialogs opened when it was sent
  var carry = null; // the dialog of a workspace being replaced, to show again in the new one

  function $(id) { return document.getElementById(id); }
  function dialog() { return $("action-dialog"); }
  function focusables(root) {
    return [].slice.call(root.querySelectorAll("a[href], button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea:not([disabled]), summary, [tabindex]:not([tabindex='-1'])"))
      .filter(function (el) { return !el.closest("[hidden]") && el.getClientRects().length; });
  }
  function gone() { var s = $("live-status"); return !!(s && s.dataset.gone); }

  function toEnd() {
    var c = $("live-cursor");
    if (!c || c.dataset.tail !== "1" || location.hash) return;
    var last = document.querySelector("#live-turn:not(:empty), #turns > :last-child");
    // The newest message, not the page's end: on a narrow screen the inspector is stacked below it.
    var msgs = last ? last.querySelectorAll(".msg") : [];
    var target = msgs.length ? msgs[msgs.length - 1] : last;
    if (target) target.scrollIntoView({block: "end"});
  }

  function openDialog() {
    var d = dialog();
    if (!d || !$("dialog") || !$("dialog").children.length) return;
    if (d.open && !d.matches(":modal")) { upgrading = true; d.close(); upgrading = false; }
    if (!d.open) d.showModal();
    opened++;
    var cancel = d.querySelector("[data-dialog-close]");
    var first = focusables($("dialog"))[0];
    (cancel || first || d).focus();
    if (gone()) disable();
  }

  function setup() {
    var panel = $("session-panel");
    if (!panel || panel.dataset.ready) return;
    panel.dataset.ready = "1";
    [].forEach.call(panel.querySelectorAll("[data-copy], [data-find], #inspector-toggle"), function (el) { el.hidden = false; });
    applyInspector(localStorage.getItem(KEY) !== "closed");
    var d = dialog();
    if (d) {
      d.addEventListener("close", function () {
        if (upgrading || d.open) return; // (the close event comes later: made modal meanwhile)
        var back = opener && document.contains(opener) ? opener : document.querySelector("#history .toolbar a");
        $("dialog").innerHTML = "";
        if (back) back.focus();
        opener = null;
      });
      d.addEventListener("keydown", function (e) {
        if (e.key !== "Tab") return;
        var f = focusables(d);
        if (!f.length) return;
        var i = f.indexOf(document.activeElement);
        if (e.shiftKey && i <= 0) { f[f.length - 1].focus(); e.preventDefault(); }
        else if (!e.shiftKey && i === f.length - 1) { f[0].focus(); e.preventDefault(); }
      });
      if (d.open) openDialog(); // a full page with the dialog (no htmx): make it modal
    }
    if (gone()) disable();
  }

  function applyInspector(shown) {
    var panel = $("session-panel"), t = $("inspector-toggle");
    if (!panel || !t) return;
    panel.classList.toggle("inspector-closed", !shown);
    t.setAttribute("aria-expanded", shown ? "true" : "false");
    t.textContent = shown ? "Hide details" : "Show details";
  }

  function disable() {
    var panel = $("session-panel");
    if (!panel) return;
    panel.classList.add("gone");
    [].forEach.call(panel.querySelectorAll("button, select, input, textarea"), function (el) {
      if (!el.hasAttribute("data-keep")) el.disabled = true;
    });
    [].forEach.call(panel.querySelectorAll("a[hx-get], a[href^='/actions/']"), function (a) {
      a.setAttribute("aria-disabled", "true");
      a.setAttribute("tabindex", "-1");
      a.removeAttribute("hx-get");
    });
    if (!$("gone-note")) {
      var p = document.createElement("p");
      p.id = "gone-note";
      p.className = "note error";
      p.textContent = "This session was deleted: its actions are disabled.";
      var head = panel.querySelector(".actions") || panel.querySelector(".inspector");
      if (head) head.insertBefore(p, head.firstChild);
    }
  }

  function find(q, keepScroll) {
    q = q.trim().toLowerCase();
    var items = document.querySelectorAll("#turns .msg, #turns .call, #turns .chip");
    var hits = 0;
    [].forEach.call(items, function (el) {
      var hit = q && el.textContent.toLowerCase().indexOf(q) >= 0;
      el.classList.toggle("find-hit", !!hit);
      el.classList.toggle("find-miss", !!q && !hit);
      if (hit) {
        hits++;
        [].forEach.call(el.querySelectorAll("details:not([open])"), function (d) { d.open = true; });
        if (el.tagName === "DETAILS") el.open = true;
      }
    });
    var c = $("find-count");
    if (c) c.textContent = q ? hits + " of " + items.length + " match" : "";
    var first = keepScroll ? null : document.querySelector("#turns .find-hit");
    if (first) first.scrollIntoView({block: "center"});
  }

  // A live update or an action's answer re-renders turns: the reader's find is marked on them again, where
  // the reader is (no jump to the first hit).
  function findAgain() {
    var box = $("find-q");
    if (box && box.value.trim()) find(box.value, true);
  }

  document.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target : null;
    if (!t) return;
    if (gone() && t.closest("#session-panel [aria-disabled='true'], #session-panel.gone a[href^='/actions/']")) {
      e.preventDefault(); e.stopPropagation(); return;
    }
    var copy = t.closest("[data-copy]");
    if (copy) {
      var done = function () { copy.textContent = "Copied"; setTimeout(function () { copy.textContent = "Copy id"; }, 1500); };
      if (navigator.clipboard) navigator.clipboard.writeText(copy.dataset.copy).then(done, function () {});
      return;
    }
    if (t.closest("#inspector-toggle")) {
      var shown = $("session-panel").classList.contains("inspector-closed");
      localStorage.setItem(KEY, shown ? "open" : "closed");
      applyInspector(shown);
      return;
    }
    var close = t.closest("[data-dialog-close]");
    if (close && dialog() && dialog().open) { e.preventDefault(); dialog().close(); }
  }, true);

  var timer = null;
  document.addEventListener("input", function (e) {
    if (e.target.id !== "find-q") return;
    clearTimeout(timer);
    var v = e.target.value;
    timer = setTimeout(function () { find(v); }, 150);
  });

  document.addEventListener("htmx:beforeRequest", function (e) {
    if (gone() && e.detail.elt.closest && e.detail.elt.closest("#session-panel")) { e.preventDefault(); return; }
    if (e.detail.elt.getAttribute("hx-target") === "#dialog") opener = e.detail.elt;
    var target = e.detail.target, xhr = e.detail.xhr;
    if (target && xhr && target.id === "session-panel") asked.set(xhr, opened);
    if (target && xhr && target.id === "dialog") answerToTheDialog(e.detail.elt, xhr);
  });

  // A dialog asked for from a link that a live update or a re-read of the workspace replaced before the
  // answer came (an action's own live update often does: "Hand back…" right after a reply): htmx looks for
  // the answer's target from the detached link, finds none ("Invalid re-target #dialog") and drops it.
  // Such an answer goes to the page's dialog as it is now. htmx's events reach the detached link itself,
  // not the document.
  function answerToTheDialog(elt, xhr) {
    function load(ev) {
      if (ev.detail.xhr !== xhr) return;
      elt.removeEventListener("htmx:beforeOnLoad", load);
      if (document.contains(elt)) return; // htmx has it
      ev.preventDefault();
      var slot = $("dialog");
      if (!slot || !/^(200|40[0349])$/.test(String(xhr.status))) return; // a dialog, a refusal, "gone"
      htmx.swap(slot, xhr.responseText, {swapStyle: "innerHTML"});
      openDialog();
    }
    elt.addEventListener("htmx:beforeOnLoad", load);
    xhr.addEventListener("loadend", function () { elt.removeEventListener("htmx:beforeOnLoad", load); });
  }

  // A re-read of the workspace asked for before a dialog opened knows nothing of it: the dialog, with what
  // is typed in it, is shown again in the workspace that replaces this one (an action's answer, which the
  // dialog's own form asked for after it opened, closes it as before).
  document.addEventListener("htmx:beforeSwap", function (e) {
    var t = e.detail.target, d = dialog();
    var before = asked.get(e.detail.xhr);
    carry = t && t.id === "session-panel" && d && d.open && before !== undefined && before < opened
      ? {from: $("dialog"), focus: d.contains(document.activeElement) ? document.activeElement : null} : null;
  });
  function carryOver() {
    var c = carry, slot = $("dialog");
    carry = null;
    if (!c || !c.from || document.contains(c.from) || !slot || slot === c.from) return false;
    while (c.from.firstChild) slot.appendChild(c.from.firstChild);
    openDialog();
    if (c.focus && slot.contains(c.focus)) c.focus.focus();
    return true;
  }
  document.addEventListener("htmx:beforeSwap", function (e) {
    // A session that is gone answers 404 with a message for the dialog: show it.
    if (e.detail.xhr.status === 404 && e.detail.xhr.getResponseHeader("HX-Retarget")) {
      e.detail.shouldSwap = true;
      e.detail.isError = false;
    }
  });
  var keptAgent = null;
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var t = e.detail.target;
    if (t && t.id === "h-agent") keptAgent = t.value;
  });
  document.addEventListener("htmx:oobAfterSwap", function (e) {
    var t = e.detail.target;
    if (t && t.id === "h-agent" && keptAgent) {
      var s = $("h-agent");
      if (s && s.querySelector("option[value='" + CSS.escape(keptAgent) + "']")) s.value = keptAgent;
    }
  });
  document.addEventListener("htmx:afterSwap", function (e) {
    var t = e.detail.target;
    if (t && t.id === "dialog") { openDialog(); return; }
    findAgain();
    var panel = $("session-panel");
    if (panel && !panel.dataset.ready) { // an action's answer replaced the workspace
      setup();
      if (carryOver()) return;
      if (dialog() && !dialog().open) {
        toEnd();
        var note = panel.querySelector(".note");
        if (note) note.focus({preventScroll: true});
      }
    }
  });
  document.addEventListener("htmx:wsClose", function () {
    if (gone()) disable(); // refused as deleted (above)
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    if (gone()) {
      disable();
      return;
    }
    findAgain();
    var y = window.scrollY + window.innerHeight, h = document.documentElement.scrollHeight;
    if (h - y < 400) toEnd(); // the reader was at the end: stay there
  });

  // A search result opened the page (?hit=<message id>): that message is highlighted and brought into view.
  function showHit() {
    var id = new URLSearchParams(location.search).get("hit");
    if (!id || !/^[0-9]+$/.test(id)) return;
    var el = document.querySelector('[data-message-id="' + id + '"]');
    if (!el) return;
    el.classList.add("search-hit");
    for (var d = el.closest("details"); d; d = d.parentElement && d.parentElement.closest("details")) d.open = true;
    el.scrollIntoView({block: "center"});
  }

  function start() { setup(); toEnd(); showHit(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
