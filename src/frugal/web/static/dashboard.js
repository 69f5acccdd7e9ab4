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
    if (!r.ok) throw new Error(frugal.detail(body.detail) || r.statusText);
    return body;
  },
  usd(x) {  // cents; four places only below a cent (a tiny run's cost), never "$0.6600"
    return (Math.abs(x) >= 0.01 || x === 0) ? "$" + x.toFixed(2) : "$" + x.toFixed(4);
  },
  hms(s) {
    const t = Math.round(s), h = Math.floor(t / 3600), m = Math.floor(t % 3600 / 60);
    return `${h}:${String(m).padStart(2, "0")}:${String(t % 60).padStart(2, "0")}`;
  },
  text(id, value) { document.getElementById(id).textContent = value; },
  axis(text, extra) { return { title: { text }, ...extra }; },  // every axis names its unit
  // A chart, or where it has nothing to draw, the line that says why and what to do (not
  // bare axes); `data-empty` marks which.
  chart(id, traces, layout, empty) {
    const div = document.getElementById(id);
    if (!traces.some(t => (t.x || []).length)) {
      Plotly.purge(div);
      div.textContent = empty;
      div.dataset.empty = "1";
      return;
    }
    delete div.dataset.empty;
    Plotly.newPlot(div, traces, { margin: { t: 10 }, ...layout }, { displayModeBar: false });
  },
  fail(e, id) {  // the API's one line, where the page says how it stands
    frugal.text(id || "status", "error: " + e.message);
    document.body.dataset.ready = "error";
  },
  facts(list) {  // [name, value] pairs as a definition list, values as text
    document.getElementById("facts").replaceChildren(...list.flatMap(([k, v]) => {
      const dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = k; dd.textContent = String(v); dd.dataset.fact = k;
      return [dt, dd];
    }));
  },
  async overview(period, by) {
    try {
      const data = await frugal.get("/api/overview", { period, by });
      const rep = data.report;
      frugal.text("by", rep.by);
      const p = rep.projection;
      frugal.text("projection", p ? `month end (${p.month}): ${frugal.usd(p.projected_usd)} projected` : "");
      const b = data.budgets;
      frugal.chart("budgets", [
        { type: "bar", name: "spent", orientation: "h", y: b.map(x => x.name), x: b.map(x => x.spent_usd) },
        { type: "bar", name: "left", orientation: "h", y: b.map(x => x.name), x: b.map(x => Math.max(x.left_usd, 0)) },
      ], { barmode: "stack", margin: { l: 120, t: 10 }, xaxis: frugal.axis("USD this period") }, "no budgets yet: frugal budget set NAME --amount 100 --scope project=X sets one");
      const g = rep.groups;
      frugal.chart("spend", [{ type: "bar", x: g.map(x => x.group), y: g.map(x => x.spend_usd) }],
        { xaxis: frugal.axis(rep.by), yaxis: frugal.axis("USD") }, "no spend in this period");
      frugal.text("by2", rep.by);
      const days = data.daily_spend_usd;
      frugal.chart("daily", Object.entries(days).map(([name, perDay]) => {
        const d = Object.keys(perDay).sort();
        return { type: "bar", name, x: d, y: d.map(k => perDay[k]) };
      }), { barmode: "stack", xaxis: frugal.axis("day"), yaxis: frugal.axis("USD a day") },
      "no spend in this period");
      frugal.rows("#top", data.top_runs, r => [r.id.slice(0, 8), r.started_at.slice(0, 16).replace("T", " "),
        r.model, `${r.gpus}x ${r.gpu}`, r.outcome, frugal.num(r.hours, 2), frugal.usd(r.cost_usd)]);
      const list = document.getElementById("anomalies");
      list.replaceChildren(...rep.anomalies.map(a => {
        const li = document.createElement("li");
        li.textContent = `${a.day}: ${frugal.usd(a.spend_usd)} vs a median of ${frugal.usd(a.baseline_usd)}`;
        return li;
      }));
      if (!rep.anomalies.length) list.textContent = "none";
      document.body.dataset.ready = "1";
    } catch (e) { frugal.fail(e, "projection"); }
  },
  cell(row, value) {
    const td = document.createElement("td");
    td.textContent = value === null || value === undefined ? "-" : String(value);
    row.appendChild(td);
  },
  num(x, digits) { return x === null || x === undefined ? null : Number(x).toFixed(digits); },
  async runs(filters) {
    try {
      const data = await frugal.get("/api/runs", filters);
      const body = document.querySelector("#runs tbody");
      body.replaceChildren(...data.runs.map(r => {
        const tr = document.createElement("tr");
        const a = document.createElement("a");
        a.href = "/runs/" + encodeURIComponent(r.id);
        a.textContent = r.id.slice(0, 8);
        const td = document.createElement("td");
        td.appendChild(a);
        tr.appendChild(td);
        for (const v of [r.started_at.slice(0, 16).replace("T", " "), r.model, `${r.gpus}x ${r.gpu}`,
          r.outcome, frugal.num(r.predicted.hours, 2), frugal.num(r.actual.hours ?? r.hours, 2),
          frugal.num(r.predicted.cost_usd, 2), frugal.num(r.cost_usd, 2),
          frugal.num(r.predicted.peak_reserved_gib, 1), frugal.num(r.actual.peak_reserved_gib, 1),
          Object.entries(r.tags).map(([k, v]) => `${k}=${v}`).join(", ")]) frugal.cell(tr, v);
        return tr;
      }));
      frugal.text("status", `${data.runs.length} runs`);
      document.body.dataset.ready = "1";
    } catch (e) { frugal.fail(e); }
  },
  async run(id, everyS) {
    const draw = async () => {
      let r;
      try { r = await frugal.get("/api/runs/" + encodeURIComponent(id)); }
      catch (e) { frugal.fail(e); return; }
      const m = r.metrics;
      const last = m.length ? m[m.length - 1] : {};
      const left = r.budgets.length ? Math.min(...r.budgets.map(b => b.left_usd)) : null;
      const facts = [
        ["outcome", r.outcome], ["model", r.model], ["GPUs", `${r.gpus}x ${r.gpu}`],
        ["step", r.step], ["tokens", Math.round(r.tokens)], ["spent", frugal.usd(r.cost_usd)],
        ["predicted", r.predicted.cost_usd === null ? "-" : frugal.usd(r.predicted.cost_usd)],
        ["projected", r.projected_usd === undefined ? "-" : frugal.usd(r.projected_usd)],
        ["ETA", r.eta_s === undefined ? "-" : frugal.hms(r.eta_s)],
        ["total steps", r.total_steps ?? "-"],
        ["budget left", left === null ? "-" : frugal.usd(left)],
        ["tokens/s", last.tokens_per_s === undefined ? "-" : Math.round(last.tokens_per_s)],
        ["peak reserved GiB", last.peak_reserved_gib === undefined ? "-" : last.peak_reserved_gib.toFixed(2)],
      ];
      frugal.facts(facts);
      const train = m.filter(x => x.loss !== undefined), evals = m.filter(x => x.eval_loss !== undefined);
      const opts = { displayModeBar: false };
      Plotly.react("loss", [
        { name: "loss", x: train.map(x => x.step), y: train.map(x => x.loss) },
        { name: "eval loss", x: evals.map(x => x.step), y: evals.map(x => x.eval_loss), mode: "markers" },
      ], { margin: { t: 10 }, xaxis: frugal.axis("step"), yaxis: frugal.axis("loss") }, opts);
      Plotly.react("speed", [{ x: train.map(x => x.step), y: train.map(x => x.tokens_per_s) }],
        { margin: { t: 10 }, xaxis: frugal.axis("step"), yaxis: frugal.axis("tokens/s") }, opts);
      Plotly.react("dollars", [{ x: r.heartbeats.map(h => h.at), y: r.heartbeats.map(h => h.cost_usd) }],
        { margin: { t: 10 }, xaxis: frugal.axis("time (UTC)"), yaxis: frugal.axis("USD spent") }, opts);
      frugal.text("status", r.outcome === "running" ? `live: updates every ${everyS} s` : `ended: ${r.outcome}`);
      document.body.dataset.ready = "1";
      document.body.dataset.step = String(r.step);
      if (r.outcome === "running") setTimeout(draw, everyS * 1000);
    };
    await draw();
  },
  rows(selector, items, values) {
    document.querySelector(selector + " tbody").replaceChildren(...items.map(x => {
      const tr = document.createElement("tr");
      for (const v of values(x)) frugal.cell(tr, v);
      return tr;
    }));
  },
  scope(s) { return Object.entries(s).map(([k, v]) => `${k}=${v}`).join(", ") || "all spend"; },
  async budgets() {
    try {
      const data = await frugal.get("/api/budgets");
      const b = data.budgets;
      frugal.chart("burn", [
        { type: "bar", name: "spent", orientation: "h", y: b.map(x => x.name), x: b.map(x => x.spent_usd) },
        { type: "bar", name: "left", orientation: "h", y: b.map(x => x.name), x: b.map(x => Math.max(x.left_usd, 0)) },
      ], { barmode: "stack", margin: { l: 120, t: 10 }, xaxis: frugal.axis("USD this period") }, "no budgets yet: frugal budget set NAME --amount 100 --scope project=X sets one");
      frugal.chart("burndown", b.flatMap(x => [
        { name: x.name, mode: "lines+markers", x: x.burn.map(d => d.day), y: x.burn.map(d => d.spent_usd) },
        { name: x.name + " amount", mode: "lines", line: { dash: "dot" },
          x: x.burn.length ? [x.burn[0].day, x.burn[x.burn.length - 1].day] : [], y: [x.amount_usd, x.amount_usd] },
      ]), { xaxis: frugal.axis("day"), yaxis: frugal.axis("USD spent this period") }, "no budgets yet: frugal budget set NAME --amount 100 --scope project=X sets one");
      frugal.rows("#budgets", b, x => [x.name, frugal.scope(x.scope), x.period, x.action,
        frugal.usd(x.amount_usd), frugal.usd(x.spent_usd), frugal.usd(x.left_usd),
        x.used_pct.toFixed(0) + "%", x.thresholds_pct.map(t => t + "%").join(" ")]);
      frugal.rows("#alerts", data.alerts, a => [a.fired_at.slice(0, 16).replace("T", " "),
        a.budget, a.threshold_pct + "%", frugal.usd(a.spend_usd)]);
      frugal.text("status", `${b.length} budgets, ${data.alerts.length} alerts`);
      document.body.dataset.ready = "1";
    } catch (e) { frugal.fail(e); }
  },
  drawPlan(p) {  // a plan as the books keep it: {id, created_at, model, tags, plan}
    const rec = p.plan.recommendation || p.plan;
    const label = x => `${x.provider} ${x.instance}${x.spot ? " spot" : ""} ${x.method}`;
    // a figure and its range (plans recorded before ranges have none)
    // as the command prints it: "$0.66 ($0.60-0.76) in 2.20 h (1.99-2.54)"
    const range = (key, fmt) => rec[key + "_range"]
      ? ` (${fmt(rec[key + "_range"][0])}-${fmt(rec[key + "_range"][1]).replace(/^\$/, "")})` : "";
    const hours = h => h.toFixed(2);
    frugal.facts([["model", p.model], ["plan", label(rec)], ["GPUs", `${rec.gpus}x ${rec.gpu}`],
      ["estimate", `${frugal.usd(rec.est_cost_usd)}${range("est_cost_usd", frugal.usd)} in `
        + `${hours(rec.est_hours)} h${range("est_hours", hours)}` + (rec.bound ? `, ${rec.bound}-bound` : "")],
      ["tags", frugal.scope(p.tags)]]);
    frugal.items("reasons", rec.reasons || [], x => x);
    frugal.items("settings", p.plan.settings || [], s => `${s.setting} ${s.value}: ` + (s.yours
      ? `yours (frugal would choose ${s.frugal_would_choose}: ${s.reason} [${s.source}])`
      : `${s.reason} [${s.source}]`));
    const f = p.plan.frontier || [];
    // each plan's range as error bars: the same plan at the fastest and slowest speed expected
    const bars = (xs, key) => xs.every(x => x[key + "_range"]) ? { type: "data", symmetric: false,
      array: xs.map(x => x[key + "_range"][1] - x[key]),
      arrayminus: xs.map(x => x[key] - x[key + "_range"][0]) } : undefined;
    const trace = (xs, extra) => ({ x: xs.map(x => x.est_hours), y: xs.map(x => x.est_cost_usd),
      text: xs.map(label), error_x: bars(xs, "est_hours"), error_y: bars(xs, "est_cost_usd"), ...extra });
    frugal.chart("frontier", [
      trace(f, { name: "frontier", mode: "lines+markers" }),
      trace([rec], { name: "chosen", mode: "markers", marker: { size: 14 } }),
    ], { xaxis: frugal.axis("hours (log)", { type: "log" }), yaxis: frugal.axis("USD (log)", { type: "log" }) },
    "no plan to draw");
    frugal.items("rejected", p.plan.rejected || [], r => `${r.option}: ${r.why}`);
    frugal.items("notes", p.plan.notes || [], x => x);
  },
  items(id, list, text) {  // a list of lines, as text; "none" when empty
    const ul = document.getElementById(id);
    if (!ul) return;
    ul.replaceChildren(...list.map(x => {
      const li = document.createElement("li");
      li.textContent = text(x);
      return li;
    }));
    if (!list.length) ul.textContent = "none";
  },
  async plan(id) {
    try {
      const p = await frugal.get("/api/plans/" + encodeURIComponent(id));
      frugal.drawPlan(p);
      frugal.text("status", `plan ${p.id}, ${p.created_at.slice(0, 16).replace("T", " ")}`);
      document.body.dataset.ready = "1";
    } catch (e) { frugal.fail(e); }
  },
  newPlan() {  // the Plan form: the request `frugal plan` makes, answered by the same API
    const form = document.getElementById("ask");
    document.body.dataset.ready = "1";
    form.addEventListener("submit", async ev => {
      ev.preventDefault();
      const asked = {};
      for (const [k, v] of new FormData(form)) {
        const value = String(v).trim();
        if (!value) continue;
        if (k === "tag") asked.tag = value.split(/[\s,]+/).filter(Boolean);
        else if (k === "spot") asked.spot = value === "only";
        else asked[k] = form.elements[k].type === "number" ? Number(value) : value;
      }
      document.body.dataset.ready = "planning";
      frugal.text("status", "planning...");
      document.getElementById("answer").hidden = true;
      try {
        const r = await fetch("/api/plans", { method: "POST", credentials: "same-origin",
          headers: { "Content-Type": "application/json" }, body: JSON.stringify(asked) });
        const out = await r.json();
        if (!r.ok) throw new Error(frugal.detail(out.detail) || r.statusText);
        document.getElementById("answer").hidden = false;
        frugal.drawPlan({ model: out.model, tags: out.tags, plan: out });
        const link = document.getElementById("recorded");
        link.textContent = out.plan_id === null ? "not on the books" : `plan ${out.plan_id}`;
        link.href = out.plan_id === null ? "#" : "/plans/" + out.plan_id;
        frugal.text("status", `${out.feasible_plans} feasible plans`);
        document.body.dataset.ready = "1";
      } catch (e) { frugal.fail(e); }
    });
  },
  detail(d) {  // FastAPI's detail: our one line, or the schema's list of problems
    if (!Array.isArray(d)) return d;
    return d.map(x => `${(x.loc || []).slice(1).join(".")}: ${x.msg}`).join("; ");
  },
  async quality() {  // ?scope=k=v (repeatable): the runs of a sweep, quality beside cost
    const form = document.getElementById("scope"), here = new URLSearchParams(location.search);
    form.elements.scope.value = here.getAll("scope").join(" ");
    form.elements.metric.value = here.get("metric") || "eval_loss";
    form.addEventListener("submit", ev => {
      ev.preventDefault();
      const q = new URLSearchParams();
      form.elements.scope.value.split(/[\s,]+/).filter(Boolean).forEach(t => q.append("scope", t));
      q.set("metric", form.elements.metric.value);
      location.search = q.toString();
    });
    try {
      const data = await frugal.get("/api/quality?" + here.toString());
      const ranked = data.runs.filter(r => r.rank !== null);
      const front = ranked.filter(r => r.frontier).sort((a, b) => a.cost_usd - b.cost_usd);
      frugal.text("best", `best ${data.label}`);
      const label = r => `${r.run_id.slice(0, 8)} lr ${r.settings.learning_rate}`;
      // runs of different tasks or data are never compared: a series and a frontier each
      const groups = [...new Set(ranked.map(r => r.group))];
      const named = g => groups.length > 1 ? ` (${g})` : "";
      frugal.chart("quality", groups.flatMap(g => {
        const mine = ranked.filter(r => r.group === g), top = front.filter(r => r.group === g);
        return [
          { name: "runs" + named(g), mode: "markers", x: mine.map(r => r.cost_usd), y: mine.map(r => r.value), text: mine.map(label) },
          { name: "frontier" + named(g), mode: "lines+markers", x: top.map(r => r.cost_usd), y: top.map(r => r.value), text: top.map(label) },
        ];
      }), { xaxis: frugal.axis("USD a run"), yaxis: frugal.axis(`best ${data.label}`) },
      `no run in this scope has its ${data.label} on the books yet: runs with evaluation (training.eval_every) record it`);
      frugal.rows("#ranked", data.runs, r => [r.rank === null ? "-" : `${r.rank}${r.frontier ? " *" : ""}`,
        r.run_id.slice(0, 8), r.value === null ? "-" : r.value.toFixed(4), "$" + r.cost_usd.toFixed(4),
        r.hours.toFixed(3), r.settings.model, r.settings.method, r.settings.learning_rate ?? "-", r.settings.lora_r ?? "-",
        r.group]);
      frugal.items("effects", data.effects, e => `${e.setting} moved the best ${data.label} by ${e.moved.toFixed(4)} (${e.group}): ` +
        e.by_value.map(v => `${v.value} -> ${v.best.toFixed(4)} (${v.runs} runs)`).join("; "));
      frugal.items("notes", data.notes, x => x);
      frugal.text("status", `${data.runs.length} runs, ${front.length} on the frontier (* in the table)`);
      document.body.dataset.ready = "1";
    } catch (e) { frugal.fail(e); }
  },
  async calibration() {
    try {
      const data = await frugal.get("/api/calibration");
      for (const [div, key, unit] of [["speed", "tokens_per_s", "tokens/s"], ["memory", "peak_reserved_gib", "GiB reserved"]]) {
        const pts = data.points.filter(p => p["predicted_" + key] && p["actual_" + key]);
        const names = [...new Set(pts.map(p => `${p.gpu}/${p.method}`))];
        const top = Math.max(1, ...pts.flatMap(p => [p["predicted_" + key], p["actual_" + key]]));
        const runs = names.map(n => {
          const g = pts.filter(p => `${p.gpu}/${p.method}` === n);
          return { name: n, mode: "markers", x: g.map(p => p["predicted_" + key]), y: g.map(p => p["actual_" + key]) };
        });
        const diagonal = { name: "measured = predicted", mode: "lines", x: [0, top], y: [0, top], line: { dash: "dot" } };
        // the diagonal alone is no chart: with no run measured, say how to get one
        frugal.chart(div, runs.length ? [...runs, diagonal] : [],
          { xaxis: frugal.axis(`predicted ${unit}`), yaxis: frugal.axis(`measured ${unit}`) },
          `no run has measured its ${unit} yet: frugal train records it (frugal train --dry-run on a GPU in a minute)`);
      }
      const ratio = x => x === null ? "-" : x.toFixed(2);
      frugal.rows("#groups", data.groups, g => [g.group, g.runs,
        ratio(g.median_actual_over_predicted_tokens_per_s), ratio(g.median_actual_over_predicted_peak_reserved_gib)]);
      frugal.text("status", `${data.points.length} runs with measurements`);
      document.body.dataset.ready = "1";
    } catch (e) { frugal.fail(e); }
  },
};
