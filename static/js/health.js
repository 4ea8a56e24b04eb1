// The health page refreshes itself every few seconds, except while the reader has rows selected (a refresh
// would drop the selection before they act on it).
(function () {
  "use strict";
  document.addEventListener("htmx:beforeRequest", function (e) {
    var elt = e.detail.elt;
    if (elt && elt.hasAttribute("data-pause-while-selected") && elt.querySelector("input:checked")) {
      e.preventDefault();
    }
  });
})();
