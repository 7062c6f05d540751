// Opening a cell's detail is a link to its #id (CSS :target shows it, with or without scripts);
// this only marks the cell whose detail is open, and closes it with Escape.
(function () {
  function mark() {
    document.querySelectorAll("td.cell.selected").forEach(function (td) { td.classList.remove("selected"); });
    var id = location.hash.slice(1);
    if (!id) return;
    var link = document.querySelector('td.cell a[href="#' + id + '"]');
    if (link) link.parentElement.classList.add("selected");
  }
  window.addEventListener("hashchange", mark);
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && location.hash) location.hash = "";
  });
  mark();
})();
