// The league table sorts by the column whose name is clicked: by its numbers (a cell
// without one last), the column's better end first; a second click reverses it.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("league-table");
  if (!table) return;
  const body = table.tBodies[0];
  let sortedBy = null;
  let ascending = true;

  function key(row, column) {
    const cell = row.children[column];
    const raw = cell.dataset.sort;
    if (column === 0) return raw;
    return raw === "" || raw === undefined ? null : Number(raw);
  }

  table.querySelectorAll("button.sort").forEach((button) => {
    button.addEventListener("click", () => {
      const column = Number(button.dataset.column);
      ascending = sortedBy === column ? !ascending : button.dataset.better !== "higher";
      sortedBy = column;
      const rows = Array.from(body.rows);
      rows.sort((a, b) => {
        const x = key(a, column);
        const y = key(b, column);
        if (x === null || y === null) return (x === null) - (y === null);
        const order = x < y ? -1 : x > y ? 1 : 0;
        return ascending ? order : -order;
      });
      rows.forEach((row) => body.appendChild(row));
      table.querySelectorAll("th[aria-sort]").forEach((th) => th.removeAttribute("aria-sort"));
      button.parentElement.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    });
  });
});
