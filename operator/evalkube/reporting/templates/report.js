"use strict";
// Filters the per-sample browser. It only reads the page and toggles `hidden`: sample text
// is untrusted, so nothing here builds HTML from it.
(function () {
  var form = document.getElementById("filters");
  var samples = Array.prototype.slice.call(document.querySelectorAll("article.sample"));
  var shown = document.getElementById("shown");
  var statuses = {failed: ["invalid", "errored"]};
  function value(name) { return form.elements[name].value; }
  function apply() {
    var status = value("status"), task = value("task"), model = value("model");
    var text = value("text").trim().toLowerCase();
    var count = 0;
    samples.forEach(function (el) {
      var d = el.dataset;
      var ok = true;
      if (status === "wrong") ok = d.wrong === "1";
      else if (status) ok = (statuses[status] || [status]).indexOf(d.status) >= 0;
      if (ok && task) ok = d.task === task;
      if (ok && model) ok = d.model === model;
      if (ok && text) ok = el.textContent.toLowerCase().indexOf(text) >= 0;
      el.hidden = !ok;
      if (ok) count += 1;
    });
    shown.textContent = String(count);
  }
  form.addEventListener("input", apply);
  form.addEventListener("change", apply);
  form.addEventListener("submit", function (event) { event.preventDefault(); apply(); });
  apply();
})();
