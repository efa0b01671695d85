// Board page (#/board): every SAE's eval metrics (GET /board) as a sortable table, each
// metric against L0 as a Pareto plot (one point per SAE, as SAEBench plots them), the
// per-letter absorption of one SAE and its autointerp explanations with their scores
// (GET /saes/{id}/evals/{eval}). Uses app.js's helpers (api, el, fmt, enc, featLink,
// highlighted, needs, PALETTE; svg.js's svg); inline SVG, no other dependency. Only `boardView` is global.
(function () {
"use strict";

const L0 = "core/l0";
const LEXICAL_PROXY = "lexical proxy";
// The headline columns, with the direction that is better (null: none; no frontier drawn).
const HEADLINE = [
  [L0, null], ["core/explained_variance", 1], ["core/ce_loss_score", 1], ["core/kl_div_score", 1],
  ["core/frac_alive", 1], ["sparse_probing/llm_test_accuracy", 1], ["sparse_probing/sae_top_1_test_accuracy", 1],
  ["absorption/mean_absorption_fraction_score", -1], ["absorption/mean_full_absorption_score", -1],
  ["absorption/mean_num_split_features", null], ["scr/scr_metric_threshold_20", 1],
  ["tpp/tpp_threshold_20_total_metric", 1], ["autointerp/autointerp_score", 1],
  ["meta/decoder_fraction_variance_explained", null], ["mdl/description_length", -1], ["ground_truth/mcc", 1],
];
const BETTER = Object.fromEntries(HEADLINE);
const isNum = (x) => typeof x === "number" && Number.isFinite(x);
const isProxy = (row) => row.metrics["autointerp/backend"] === LEXICAL_PROXY;

// A metric's header: its eval above its name; autointerp columns say which back-end scored them.
function metricHeader(column, rows) {
  const [evalName, metric] = column.split("/");
  const proxy = evalName === "autointerp" && rows.some(isProxy);
  return [el("span", { class: "board-eval" }, evalName), el("br"), metric,
    proxy ? el("span", { class: "proxy", title: "offline lexical proxy: labels matched word by word, not LLM autointerp" },
      " (lexical proxy)") : ""];
}

// --- the sortable table ------------------------------------------------------------------------
function boardTable(board, columns, sort, redraw) {
  const value = (row, c) => (c === "sae_id" ? row.sae_id : row.metrics[c]);
  const rows = [...board.rows];
  if (sort.key) {
    rows.sort((a, b) => {
      const [x, y] = [value(a, sort.key), value(b, sort.key)];
      if (x === null || x === undefined) return 1;  // missing values last in either order
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * (sort.desc ? -1 : 1);
    });
  }
  const header = ["sae_id", ...columns].map((c) => el("th", {
    class: "sortable" + (sort.key === c ? (sort.desc ? " desc" : " asc") : ""), "data-column": c,
    onclick: () => { sort.desc = sort.key === c ? !sort.desc : true; sort.key = c; redraw(); },
  }, c === "sae_id" ? "SAE" : metricHeader(c, board.rows)));
  const cell = (row, c) => {
    const v = row.metrics[c];
    if (c.startsWith("autointerp/") && isNum(v) && isProxy(row)) {
      return el("td", {}, fmt(v), el("span", { class: "proxy" }, " proxy"));
    }
    return el("td", {}, fmt(v));
  };
  return el("table", { id: "board-table", class: "board" }, el("tr", {}, header),
    rows.map((row) => el("tr", { "data-sae": row.sae_id },
      el("td", {}, el("a", { class: "feat", href: `#/saes/${enc(row.sae_id)}` }, row.sae_id),
        row.status !== "ok" ? el("span", { class: `suspect ${row.status}`, title: row.problem }, ` ${row.status}`) : ""),
      columns.map((c) => cell(row, c)))));
}

// --- Pareto plots: one metric against L0, one point per SAE ------------------------------------------
function scale(values, from, to, log) {
  const v = log ? values.map(Math.log10) : values;
  let [lo, hi] = [Math.min(...v), Math.max(...v)];
  const pad = hi > lo ? (hi - lo) * 0.08 : Math.max(Math.abs(lo) * 0.05, 0.05);
  [lo, hi] = [lo - pad, hi + pad];
  const f = (x) => from + (((log ? Math.log10(x) : x) - lo) / (hi - lo)) * (to - from);
  f.ticks = [0, 0.5, 1].map((t) => (log ? 10 ** (lo + t * (hi - lo)) : lo + t * (hi - lo)));
  return f;
}

// The SAEs no other SAE beats at a lower or equal L0 (SAEBench's frontier), by L0.
function frontier(points, better) {
  return points.filter((p) => !points.some((q) => q !== p && q.x <= p.x && better * q.y >= better * p.y
    && (q.x < p.x || better * q.y > better * p.y))).sort((a, b) => a.x - b.x);
}

function paretoPlot(board, metric, colours) {
  const [W, H, left, right, top, bottom] = [330, 210, 52, 12, 24, 34];
  const points = board.rows.filter((r) => isNum(r.metrics[L0]) && isNum(r.metrics[metric]))
    .map((r) => ({ sae: r.sae_id, x: r.metrics[L0], y: r.metrics[metric] }));
  const plot = svg("svg", { class: "pareto", width: W, height: H, "data-metric": metric, "data-points": points.length });
  const proxy = metric.startsWith("autointerp/") && board.rows.some(isProxy) ? " (lexical proxy)" : "";
  const better = BETTER[metric];
  const [evalName, name] = metric.split("/");
  plot.append(svg("text", { x: 6, y: 14, class: "title" }, svg("tspan", { class: "eval" }, evalName + " "), name,
    better ? (better > 0 ? " ↑" : " ↓") : "", svg("tspan", { class: "proxy" }, proxy)));
  if (!points.length) return plot;
  const xs = points.map((p) => p.x);
  const log = Math.min(...xs) > 0 && Math.max(...xs) / Math.min(...xs) >= 10;
  const sx = scale(xs, left, W - right, log);
  const sy = scale(points.map((p) => p.y), H - bottom, top, false);
  plot.append(svg("line", { x1: left, y1: H - bottom, x2: W - right, y2: H - bottom, class: "axis" }),
    svg("line", { x1: left, y1: top, x2: left, y2: H - bottom, class: "axis" }),
    svg("text", { x: (left + W - right) / 2, y: H - 4, class: "label" }, log ? "L0 (log)" : "L0"));
  for (const t of sx.ticks) plot.append(svg("text", { x: sx(t), y: H - bottom + 13, class: "tick", "text-anchor": "middle" }, fmt(t)));
  for (const t of sy.ticks) plot.append(svg("text", { x: left - 4, y: sy(t) + 4, class: "tick", "text-anchor": "end" }, fmt(t)));
  if (better) {
    const front = frontier(points, better);
    if (front.length > 1) plot.append(svg("polyline", { class: "frontier", points: front.map((p) => `${sx(p.x)},${sy(p.y)}`).join(" ") }));
  }
  for (const p of points) {
    plot.append(svg("circle", { cx: sx(p.x), cy: sy(p.y), r: 5, fill: colours[p.sae], "data-sae": p.sae },
      svg("title", {}, `${p.sae}\nL0 ${fmt(p.x)} · ${metric} ${fmt(p.y)}`)));
  }
  return plot;
}

// --- per-letter absorption bars of one SAE ------------------------------------------------------------
function letterBars(letters, series, maxValue, threshold) {
  const [W, H, left, bottom, top] = [Math.max(360, 26 * letters.length + 60), 190, 36, 24, 10];
  const band = (W - left - 8) / Math.max(1, letters.length);
  const y = (v) => H - bottom - (Math.min(v, maxValue) / maxValue) * (H - bottom - top);
  const chart = svg("svg", { id: "absorption-bars", width: W, height: H, "data-letters": letters.length });
  chart.append(svg("line", { x1: left, y1: H - bottom, x2: W - 8, y2: H - bottom, class: "axis" }));
  for (const t of [0, maxValue / 2, maxValue]) {
    chart.append(svg("text", { x: left - 4, y: y(t) + 4, class: "tick", "text-anchor": "end" }, fmt(t)));
  }
  letters.forEach((letter, i) => {
    const x0 = left + i * band;
    series.forEach((s, j) => {
      const v = s.values[i] || 0;
      const w = (band - 4) / series.length;
      chart.append(svg("rect", { x: x0 + 2 + j * w, y: y(v), width: Math.max(1, w - 1), height: H - bottom - y(v),
        fill: s.colour, class: "bar" }, svg("title", {}, `${letter}: ${s.name} ${fmt(v)}`)));
    });
    chart.append(svg("text", { x: x0 + band / 2, y: H - bottom + 14, class: "tick", "text-anchor": "middle" }, letter));
  });
  if (threshold !== undefined) {
    chart.append(svg("line", { x1: left, y1: y(threshold), x2: W - 8, y2: y(threshold), class: "threshold" }));
  }
  const legend = el("div", { class: "legend" }, series.map((s) =>
    el("span", {}, el("i", { style: `background:${s.colour}` }), s.name)));
  return el("div", {}, chart, legend);
}

async function absorptionPanel(out, sae) {
  const result = await api(`/saes/${enc(sae)}/evals/absorption`);
  const details = result.eval_result_details;
  const extra = result.eval_result_unstructured || {};
  if (details.length) {
    out.replaceChildren(el("p", { class: "muted" }, "Per first letter, over the held-out words the letter's probe finds: the share of its direction other latents absorb, and the share of words where no main latent fires at all."),
      letterBars(details.map((d) => d.first_letter), [
        { name: "mean absorption fraction", colour: "#e8590c", values: details.map((d) => d.mean_absorption_fraction) },
        { name: "full absorption rate", colour: "#862e9c", values: details.map((d) => d.full_absorption_rate) },
      ], 1),
      el("p", { class: "muted" }, "split features per letter: ",
        details.map((d) => `${d.first_letter} ${d.num_split_features}`).join(" · ")));
    return;
  }
  const f1 = Object.entries(extra.probe_f1 || {});
  out.replaceChildren(el("p", { class: "note", id: "absorption-not-scored" }, extra.not_scored || "no letter was scored"),
    el("p", { class: "muted" }, `The letters' probe F1 (a letter is scored above ${result.eval_config.min_GT_probe_f1}, the line):`),
    letterBars(f1.map(([letter]) => letter), [{ name: "probe F1", colour: "#1c7ed6", values: f1.map(([, v]) => v) }], 1,
      result.eval_config.min_GT_probe_f1));
}

// --- autointerp explanations with their scores ---------------------------------------------------------
async function autointerpPanel(out, sae) {
  const result = await api(`/saes/${enc(sae)}/evals/autointerp`);
  const backend = result.eval_result_unstructured.backend;
  const rows = [...result.eval_result_details].sort((a, b) => b.detection_balanced_accuracy - a.detection_balanced_accuracy);
  const shown = rows.length > 8 ? [...rows.slice(0, 4), ...rows.slice(-4)] : rows;
  const cards = await Promise.all(shown.map(async (row) => {
    const examples = (await api(`/saes/${enc(sae)}/features/${row.latent}/examples?kind=top`)).slice(0, 2);
    return el("div", { class: "card autointerp-latent", "data-latent": row.latent },
      el("div", {}, featLink(sae, row.latent, `feature ${row.latent}`), " ", el("b", {}, row.explanation)),
      el("div", { class: "muted" }, ["detection", "fuzzing"].map((s) =>
        `${s}: balanced accuracy ${fmt(row[`${s}_balanced_accuracy`])}, F1 ${fmt(row[`${s}_f1`])}, AUC ${fmt(row[`${s}_auc`])}`).join(" · ")),
      examples.map((e) => el("div", { class: "example" }, highlighted(e.tokens, e.acts, null, e.centre))));
  }));
  out.replaceChildren(
    backend === LEXICAL_PROXY
      ? el("p", { class: "note", id: "autointerp-backend" }, "Explained and scored by the lexical proxy: the explanation is the latent's offline label and the simulator matches its words; this is not LLM autointerp.")
      : el("p", { id: "autointerp-backend" }, `Explained and scored by ${backend}.`),
    el("p", { class: "muted" }, `${rows.length} latents; the ${shown.length === rows.length ? "" : "4 best and 4 worst "}by detection balanced accuracy, with two of their top examples.`),
    el("div", { id: "autointerp-latents" }, cards));
}

// --- the page ----------------------------------------------------------------------------------------
async function boardView() {
  const board = await api("/board");
  const rows = board.rows;
  const colours = Object.fromEntries(rows.map((r, i) => [r.sae_id, PALETTE[i % PALETTE.length]]));
  const headline = HEADLINE.map(([c]) => c).filter((c) => board.columns.includes(c));
  const sort = { key: board.columns.includes(L0) ? L0 : null, desc: false };
  const all = el("input", { type: "checkbox", id: "board-all" });
  const tableBox = el("div", { class: "board-scroll" });
  const redraw = () => tableBox.replaceChildren(boardTable(board, all.checked ? board.columns : headline, sort, redraw));
  all.onchange = redraw;
  redraw();
  const plotted = headline.filter((c) => c !== L0 && rows.some((r) => isNum(r.metrics[c])));
  const plots = el("div", { id: "pareto-plots", class: "plots" }, board.columns.includes(L0)
    ? plotted.map((c) => paretoPlot(board, c, colours))
    : el("p", { class: "muted" }, "No L0 yet: run `sae-atlas eval --suite core` to plot the metrics against it."));
  const legend = el("div", { class: "legend" }, rows.map((r) => el("span", {}, el("i", { style: `background:${colours[r.sae_id]}` }), r.sae_id)));
  // An SAE's result of one eval, shown for the SAE picked (first: one with numbers of that eval).
  const panel = (evalName, render, id) => {
    if (!rows.length) return "";
    const scored = rows.find((r) => Object.keys(r.metrics).some((c) => c.startsWith(evalName + "/") && r.metrics[c] !== null));
    const select = el("select", { id: `${id}-sae` }, rows.map((r) => el("option", { value: r.sae_id }, r.sae_id)));
    const out = el("div", { id });
    const failed = (err) => out.replaceChildren(el("div", { class: "muted no-result" }, err.message));
    select.onchange = () => render(out, select.value).catch(failed);
    (async () => {  // first the SAE with numbers of the eval, else the first SAE that has a result
      const order = [...new Set([(scored || rows[0]).sae_id, ...rows.map((r) => r.sae_id)])];
      let first = null;
      for (const sae of order) {
        select.value = sae;
        try { await render(out, sae); return; } catch (err) { first = first || err; }
      }
      select.value = order[0];
      failed(first);
    })();
    return el("div", {}, el("div", {}, "SAE ", select), out);
  };
  view.replaceChildren(el("h2", {}, "Eval board"),
    rows.length ? "" : el("p", { class: "muted" }, "No SAEs yet."),
    rows.length && !board.columns.length ? needs("needs-eval", "No eval results yet. Run", "sae-atlas eval <atlas> --suite core") : "",
    el("p", { class: "muted" }, `${rows.length} SAEs · ${board.columns.length} metrics · click a header to sort · `,
      el("label", {}, all, " all metrics")),
    tableBox,
    el("h3", {}, "Each metric against L0 (one point per SAE; the line joins the SAEs no other beats at a lower L0)"),
    legend, plots,
    el("h3", {}, "Absorption per first letter"), panel("absorption", absorptionPanel, "absorption"),
    el("h3", {}, "Autointerp: explanations and their scores"), panel("autointerp", autointerpPanel, "autointerp"));
}

window.boardView = boardView;
})();
