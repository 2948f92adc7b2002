// Roost Control UI: the only script besides htmx (no inline script anywhere, CSP forbids it).
// - <time datetime="...Z"> elements are shown in the viewer's timezone;
// - a form or button with data-confirm="question" asks before it is sent;
// - htmx sends the page's CSRF token (meta csrf-token) as X-CSRF-Token on every request.
(function () {
  "use strict";

  function localise(root) {
    var times = (root || document).querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      if (el.dataset.local) continue;
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when.getTime())) continue;
      el.title = el.textContent;
      el.textContent = when.toLocaleString();
      el.dataset.local = "1";
    }
  }

  function csrf() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  document.addEventListener("DOMContentLoaded", function () { localise(document); });
  document.addEventListener("htmx:afterSwap", function (e) { localise(e.target); });
  document.addEventListener("htmx:sseMessage", function (e) { localise(e.target); });
  document.addEventListener("htmx:configRequest", function (e) {
    var token = csrf();
    if (token) e.detail.headers["X-CSRF-Token"] = token;
  });
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var button = e.submitter;
    var question = (button && button.dataset.confirm) || form.dataset.confirm;
    if (question && !window.confirm(question)) {
      e.preventDefault();
      e.stopImmediatePropagation();
    }
  }, true);
})();
