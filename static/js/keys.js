/* Keyboard shortcuts of the console: "/" focuses the search box, "j"/"k" move through the session list,
   Enter opens the focused session (it is a link), "g" then "s" goes to the session list, "?" shows the
   shortcuts dialog. Ignored while typing in a field or with Ctrl/Alt/Meta held. */
(function () {
  "use strict";
  var pendingG = 0;

  function typing(el) {
    if (!el) return false;
    var tag = el.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || el.isContentEditable;
  }

  function rowLinks() {
    return Array.prototype.slice.call(document.querySelectorAll("tr[data-row] td.sid a"));
  }

  function move(step) {
    var links = rowLinks();
    if (!links.length) return false;
    var current = links.indexOf(document.activeElement);
    var next = current < 0 ? (step > 0 ? 0 : links.length - 1)
                           : Math.min(links.length - 1, Math.max(0, current + step));
    links[next].focus();
    links[next].scrollIntoView({block: "nearest"});
    return true;
  }

  // A live update (or a search's answer) replaces rows of the list: the session link that had the focus gets
  // it back (the same session, wherever its row now is), so "j"/"k" go on from there and Enter opens the
  // session chosen.
  var keptHref = null;
  function keep() {
    var el = document.activeElement;
    if (el && rowLinks().indexOf(el) >= 0) keptHref = el.getAttribute("href");
  }
  function refocus() {
    var href = keptHref, el = document.activeElement;
    if (!href) return;
    if (el && el !== document.body) { keptHref = null; return; } // still focused, or moved on purpose
    var again = rowLinks().filter(function (a) { return a.getAttribute("href") === href; })[0];
    if (again) { again.focus({preventScroll: true}); keptHref = null; }
  }
  document.addEventListener("htmx:beforeSwap", keep);
  document.addEventListener("htmx:oobBeforeSwap", keep);
  document.addEventListener("htmx:afterSwap", refocus);
  document.addEventListener("htmx:oobAfterSwap", refocus);

  document.addEventListener("keydown", function (evt) {
    if (evt.defaultPrevented || evt.ctrlKey || evt.altKey || evt.metaKey || typing(evt.target)) return;
    var dialog = document.getElementById("shortcuts");
    if (dialog && dialog.open) return; // the dialog handles Esc and its button itself
    var key = evt.key, handled = false;
    if (pendingG && Date.now() - pendingG < 1500) {
      pendingG = 0;
      if (key === "s") {
        window.location.assign(document.body.dataset.listUrl || "/sessions/");
        evt.preventDefault();
        return;
      }
    }
    pendingG = 0;
    if (key === "/") {
      var search = document.querySelector("[data-shortcut-search]") || document.querySelector("input[type=search]");
      if (search) { search.focus(); search.select(); handled = true; }
    } else if (key === "j") {
      handled = move(1);
    } else if (key === "k") {
      handled = move(-1);
    } else if (key === "g") {
      pendingG = Date.now();
      handled = true;
    } else if (key === "?") {
      if (dialog && typeof dialog.showModal === "function") { dialog.showModal(); handled = true; }
    }
    if (handled) evt.preventDefault();
  });
})();
