// The dashboard's pages: each fetches its figures from the JSON API and draws them with
// plotly (served from the installed plotly package: no network). User text (tags, names)
// only ever goes into the page as text, never as HTML.
"use strict";
const frugal = {
  async get(path, params) {
    const url = new URL(path, window.location.origin);
    for (const [k, v] of Object.entries(params || {})) if (v) url.searchParams.set(k, v);
    const r = await fetch(url, { credentials: "same-origin" });
    const body = await r.json();
    if (!r.ok) throw new Error(body.detail || r.statusText);
    return body;
  },
  usd(x) {
    return (Math.abs(x) >= 1 || x === 0) ? "$" + x.toFixed(2) : "$" + x.toFixed(4);
  },
  text(id, value) { document.getElementById(id).textContent = value; },
  fail(e) {
    frugal.text("projection", "error: " + e.message);
    document.body.dataset.ready = "error";
  },
  async overview(period, by) {
    try {
      const data = await frugal.get("/api/overview", { period, by });
      const rep = data.report;
      frugal.text("by", rep.by);
      const p = rep.projection;
      frugal.text("projection", p ? `month end (${p.month}): ${frugal.usd(p.projected_usd)} projected` : "");
      const b = data.budgets;
      Plotly.newPlot("budgets", [
        { type: "bar", name: "spent", orientation: "h", y: b.map(x => x.name), x: b.map(x => x.spent_usd) },
        { type: "bar", name: "left", orientation: "h", y: b.map(x => x.name), x: b.map(x => Math.max(x.left_usd, 0)) },
      ], { barmode: "stack", margin: { l: 120, t: 10 }, xaxis: { title: "USD this period" } },
      { displayModeBar: false });
      const g = rep.groups;
      Plotly.newPlot("spend", [{ type: "bar", x: g.map(x => x.group), y: g.map(x => x.spend_usd) }],
        { margin: { t: 10 }, yaxis: { title: "USD" } }, { displayModeBar: false });
      const list = document.getElementById("anomalies");
      list.replaceChildren(...rep.anomalies.map(a => {
        const li = document.createElement("li");
        li.textContent = `${a.day}: ${frugal.usd(a.spend_usd)} vs a median of ${frugal.usd(a.baseline_usd)}`;
        return li;
      }));
      if (!rep.anomalies.length) list.textContent = "none";
      document.body.dataset.ready = "1";
    } catch (e) { frugal.fail(e); }
  },
};
