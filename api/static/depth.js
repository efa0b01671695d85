// Depth page (#/depth): the stored depth runs (GET /depth) and one run (#/depth/<run>, GET
// /depth/<run>), picked from a list. A corpus run shows the intrinsic dimension (TwoNN and MLE with
// their bootstrap intervals) and the local dimension (median with its 10-90% band) against depth,
// the logit and tuned lenses' top-1 agreement and KL against depth, the CKA heat map between
// layers, the trajectory means per layer and the distributions of per-token trajectory metrics,
// the tokens with extreme trajectories (a click opens the Text page on the token's context, where
// the run recorded it), the features of joined SAEs whose tokens sit lowest and highest in local
// dimension, and the stored figures. A families run shows each family's local dimension against
// depth, its trajectory means and every pairwise permutation test. A pair run (two models on the
// same texts) shows the CKA of A's layers against B's and the ID and local-ID shift from A to B
// with its interval, per layer read in both. Uses app.js's helpers (api, el,
// fmt, enc, featLink, table, authHeaders, PALETTE) and svg.js's svg, linear and axes; only
// `depthListView`, `depthView` and `featureDepthCard` (the feature page's depth card) are global.
(function () {
"use strict";

const BOX = { W: 520, H: 300, left: 52, bottom: 34, top: 14, right: 12 };
const METRIC_NAME = { convergence_index: "convergence index", mean_curvature: "mean curvature (rad)",
  path_length: "path length" };
const finite = (v) => v !== null && v !== undefined && Number.isFinite(v);

// --- the listing ---------------------------------------------------------------------------------
// A run that is not "ok" is listed without a link, with its status and the problem.
function runTable(runs, current) {
  return table(["run", "kind", "model", "model_b", "layers", "n_tokens", "id_peak_layer", "families", "sae_ids", "status"], runs, {
    run: (r) => (r.status !== "ok" ? el("span", { class: `depth-run-off ${r.status}`, "data-run": r.run }, r.run)
      : r.run === current ? el("b", { class: "depth-run current" }, r.run)
      : el("a", { class: "feat depth-run", href: `#/depth/${enc(r.run)}` }, r.run)),
    layers: (r) => (r.layers.length ? `${r.layers[0]}–${r.layers[r.layers.length - 1]} (${r.layers.length})` : "–"),
    families: (r) => (r.families ? r.families.join(", ") : ""), model_b: (r) => r.model_b || "",
    sae_ids: (r) => r.sae_ids.join(", "),
    status: (r) => (r.status === "ok" ? "ok" : el("span", { class: `error depth-problem ${r.status}`, "data-run": r.run,
      title: r.problem }, `${r.status}: ${r.problem}`)) });
}

async function depthListView() {
  const runs = await api("/depth");
  view.replaceChildren(el("h2", {}, "Geometry across depth"),
    runs.length ? runTable(runs, null)
      : el("p", { class: "muted", id: "depth-none" }, "No depth runs yet (",
        el("code", {}, "sae-atlas analyze depth --atlas <atlas>"), "; ", el("code", {}, "--sae IDS"),
        " joins stored SAEs' features, ", el("code", {}, "--families FILE"), " compares prompt families)."));
}

// --- plots ----------------------------------------------------------------------------------------
// Lines against depth: `series` of { name, values, colour, band: [lows, highs], dots, dash }.
function depthPlot(id, layers, series, yLabel, range) {
  const all = series.flatMap((s) => [...s.values, ...(s.band ? [...s.band[0], ...s.band[1]] : [])]).filter(finite);
  const [lo, hi] = range || [Math.min(0, ...all), Math.max(1e-9, ...all)];
  const sx = linear(layers[0], layers[layers.length - 1], BOX.left, BOX.W - BOX.right);
  sx.ticks = layers.filter((l, i) => layers.length <= 12 || i % Math.ceil(layers.length / 10) === 0 || i === layers.length - 1);
  const sy = linear(lo, hi, BOX.H - BOX.bottom, BOX.top);
  const plot = svg("svg", { id, class: "depth-plot", width: BOX.W, height: BOX.H, "data-layers": layers.length });
  axes(plot, sx, sy, BOX, "layer", yLabel);
  const path = (pts) => pts.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
  for (const s of series) {
    if (s.band) {
      const pts = layers.map((l, i) => [l, s.band[0][i], s.band[1][i]]).filter(([, a, b]) => finite(a) && finite(b));
      if (pts.length) plot.append(svg("path", { class: "band", fill: s.colour, "fill-opacity": 0.15, stroke: "none",
        d: path(pts.map(([l, a]) => [l, a])) + path([...pts].reverse().map(([l, , b]) => [l, b])).replace("M", "L") + "Z" }));
    }
    const pts = layers.map((l, i) => [l, s.values[i]]).filter(([, v]) => finite(v));
    plot.append(svg("path", { class: `line series-${s.key || s.name}`, fill: "none", stroke: s.colour, "stroke-width": 1.6,
      "stroke-dasharray": s.dash || "none", d: path(pts), "data-points": pts.length }));
    for (const [l, v] of s.dots ? pts : []) plot.append(svg("circle", { cx: sx(l), cy: sy(v), r: 2.5, fill: s.colour },
      svg("title", {}, `${s.name}, layer ${l}: ${fmt(v)}`)));
  }
  return el("div", { class: "depth-figure" }, plot, el("div", { class: "legend" }, series.map((s) =>
    el("span", {}, el("i", { style: `background:${s.colour}` }), s.name))));
}

// A colour from white (0) to dark blue (1).
function blues(v) {
  const t = Math.max(0, Math.min(1, finite(v) ? v : 0));
  const mix = (a, b) => Math.round(a + (b - a) * t);
  return `rgb(${mix(247, 8)},${mix(251, 48)},${mix(255, 107)})`;
}

// CKA between every row layer and every column layer (a pair run: A's rows, B's columns).
function ckaHeatMap(cka, rowLabel = "layer", columnLabel = "layer") {
  const rows = cka.layers, cols = cka.layers_b, n = Math.max(rows.length, cols.length);
  const cell = Math.max(6, Math.min(24, Math.floor(420 / n))), left = 44, top = 10;
  const width = cell * cols.length, height = cell * rows.length, W = left + width + 70, H = top + height + 40;
  const plot = svg("svg", { id: "depth-cka", width: W, height: H, "data-cells": rows.length * cols.length });
  cka.values.forEach((row, i) => row.forEach((v, j) => plot.append(svg("rect", { class: "cka-cell", x: left + j * cell,
    y: top + i * cell, width: cell, height: cell, fill: blues(v) },
  svg("title", {}, `${rowLabel} ${rows[i]}, ${columnLabel} ${cols[j]}: CKA ${fmt(v)}`)))));
  const ticks = (layers, place) => layers.forEach((l, i) => {
    if (i % Math.ceil(layers.length / 10) === 0 || i === layers.length - 1) plot.append(place(l, i));
  });
  ticks(cols, (l, j) => svg("text", { x: left + (j + 0.5) * cell, y: top + height + 12, class: "tick", "text-anchor": "middle" }, l));
  ticks(rows, (l, i) => svg("text", { x: left - 4, y: top + (i + 0.5) * cell + 3, class: "tick", "text-anchor": "end" }, l));
  plot.append(svg("text", { x: left + width / 2, y: H - 6, class: "label", "text-anchor": "middle" }, columnLabel),
    svg("text", { x: 10, y: top + height / 2, class: "label", "text-anchor": "middle",
      transform: `rotate(-90 10 ${top + height / 2})` }, rowLabel));
  for (let k = 0; k <= 10; k++) {  // the colour bar
    plot.append(svg("rect", { x: left + width + 16, y: top + (10 - k) * height / 11, width: 12, height: height / 11 + 0.5, fill: blues(k / 10) }));
  }
  plot.append(svg("text", { x: left + width + 32, y: top + 8, class: "tick" }, "1"),
    svg("text", { x: left + width + 32, y: top + height, class: "tick" }, "0"));
  return plot;
}

function histogramPlot(name, d) {
  const box = { W: 300, H: 170, left: 40, bottom: 32, top: 10, right: 10 };
  const plot = svg("svg", { id: `dist-${name}`, class: "depth-hist", width: box.W, height: box.H,
    "data-count": d.counts.reduce((a, b) => a + b, 0) });
  if (!d.counts.length) return plot;
  const sx = linear(d.edges[0], d.edges[d.edges.length - 1], box.left, box.W - box.right);
  const sy = linear(0, Math.max(1, ...d.counts), box.H - box.bottom, box.top);
  axes(plot, sx, sy, box, METRIC_NAME[name] || name, "tokens");
  d.counts.forEach((c, i) => {
    if (!c) return;
    const x0 = sx(d.edges[i]), x1 = sx(d.edges[i + 1]);
    plot.append(svg("rect", { class: "bin", x: x0, y: sy(c), width: Math.max(1, x1 - x0 - 1), height: sy(0) - sy(c),
      fill: "#4c6ef5", "fill-opacity": 0.7 }, svg("title", {}, `${fmt(d.edges[i])}–${fmt(d.edges[i + 1])}: ${c}`)));
  });
  if (finite(d.median)) plot.append(svg("line", { class: "median", x1: sx(d.median), x2: sx(d.median), y1: box.top,
    y2: box.H - box.bottom, stroke: "#d9480f", "stroke-dasharray": "3 2" }, svg("title", {}, `median ${fmt(d.median)}`)));
  return plot;
}

// --- one run --------------------------------------------------------------------------------------
const column = (rows, key) => rows.map((r) => r[key]);

// The token with an extreme trajectory: its text (or id), where it is, and a link to the Text page
// on its context when the run recorded one.
function extremeToken(t) {
  const name = t.text !== null ? JSON.stringify(t.text) : `token ${t.token}`;
  const where = ` · block ${t.block}, position ${t.position} · ${METRIC_NAME[t.metric] || t.metric} ${fmt(t.value)}`;
  if (t.context === null) return el("li", { class: "extreme-token" }, el("code", {}, name), where);
  const open = (event) => {
    event.preventDefault();
    sessionStorage.setItem("sae-atlas-text", t.context);
    location.hash = "#/";
  };
  return el("li", { class: "extreme-token" }, el("a", { class: "feat", href: "#/", title: t.context, onclick: open },
    el("code", {}, name)), where);
}

function featureList(rows, shape) {
  const picked = rows.filter((f) => f.shape === shape);
  if (!picked.length) return el("p", { class: "muted" }, "none beyond |z| = 2");
  return el("ul", { class: `depth-features ${shape}` }, picked.map((f) => el("li", { title: f.says },
    featLink(f.sae_id, f.feature, `feature ${f.feature}`), ` local ID ${fmt(f.lid_mean)} vs ${fmt(f.lid_all)} (z ${fmt(f.lid_z)}, ${f.n_fires} tokens)`)));
}

function joinedFeatures(features) {
  const bySae = {};
  for (const f of features) (bySae[f.sae_id] = bySae[f.sae_id] || []).push(f);
  return el("div", { id: "depth-joined" }, Object.entries(bySae).map(([sae, rows]) => el("div", { class: "card" },
    el("h3", {}, `${sae} (layer ${rows[0].layer})`),
    el("div", { class: "grid" },
      el("div", {}, el("b", {}, "fires where the representation compresses"), featureList(rows, "compressing")),
      el("div", {}, el("b", {}, "fires where it expands"), featureList(rows.slice().reverse(), "expanding"))))));
}

async function figureImages(run, names) {
  const out = el("div", { class: "figures", id: "depth-figures" });
  for (const name of names) {
    const response = await fetch(`/analyses/depth/figures/${enc(name)}`, { headers: authHeaders() });
    if (response.ok) out.append(el("img", { alt: name, title: name, src: URL.createObjectURL(await response.blob()) }));
  }
  return out;
}

function corpusRun(r) {
  const p = r.profile, layers = r.layers, s = r.summary;
  const lens = (kind) => s[`${kind}_lens_first_layer_top1_above_half`];
  return [
    el("p", { id: "depth-headline" }, `${fmt(s.n_tokens)} tokens streamed, ${fmt(s.n_subsampled)} subsampled; `,
      el("b", {}, `ID peaks at layer ${fmt(s.id_peak_layer)}`), "; the final top-1 is agreed above 50% from layer ",
      el("b", {}, fmt(lens("logit"))), " (logit lens) and ", el("b", {}, fmt(lens("tuned"))), " (tuned lens)."),
    el("div", { class: "plots" },
      el("div", {}, el("h3", {}, "Intrinsic dimension against depth"), depthPlot("depth-id", layers, [
        { key: "twonn", name: "TwoNN (bootstrap interval)", values: column(p, "twonn"), colour: "#1f77b4", dots: true,
          band: [column(p, "twonn_low"), column(p, "twonn_high")] },
        { key: "mle", name: "MLE (bootstrap interval)", values: column(p, "mle"), colour: "#ff7f0e",
          band: [column(p, "mle_low"), column(p, "mle_high")] },
        { key: "lid", name: "local ID median (10–90%)", values: column(p, "lid_q50"), colour: "#2ca02c",
          band: [column(p, "lid_q10"), column(p, "lid_q90")], dash: "4 3" }], "dimension")),
      el("div", {}, el("h3", {}, "Layer similarity (debiased linear CKA)"), r.cka ? ckaHeatMap(r.cka) : "")),
    el("div", { class: "plots" },
      el("div", {}, el("h3", {}, "Lens agreement with the final top-1"), depthPlot("depth-lens-top1", layers, [
        { key: "logit", name: "logit lens", values: column(p, "logit_top1"), colour: "#d62728", dots: true },
        { key: "tuned", name: "tuned lens", values: column(p, "tuned_top1"), colour: "#9467bd", dots: true }],
      "top-1 agreement", [0, 1])),
      el("div", {}, el("h3", {}, "Lens KL to the final distribution"), depthPlot("depth-lens-kl", layers, [
        { key: "logit", name: "logit lens", values: column(p, "logit_kl"), colour: "#d62728", dots: true },
        { key: "tuned", name: "tuned lens", values: column(p, "tuned_kl"), colour: "#9467bd", dots: true }], "KL (nats)"))),
    el("h3", {}, "Trajectories"),
    el("div", { class: "plots" },
      depthPlot("depth-cosines", layers, [
        { key: "to-final", name: "cosine to the final state", values: column(p, "cosine_to_final"), colour: "#1f77b4" },
        { key: "consecutive", name: "cosine to the previous state", values: column(p, "consecutive_cosine"), colour: "#2ca02c" }],
      "cosine", [Math.min(0, ...column(p, "cosine_to_final").filter(finite)), 1]),
      depthPlot("depth-steps", layers, [
        { key: "curvature", name: "turning angle into the layer (rad)", values: column(p, "curvature"), colour: "#8c564b", dots: true }],
      "curvature (rad)"),
      depthPlot("depth-step-length", layers, [
        { key: "step", name: "step length into the layer", values: column(p, "step_length"), colour: "#7f7f7f", dots: true }],
      "step length")),
    el("h3", {}, "Per-token trajectory metrics"),
    el("div", { class: "plots", id: "depth-distributions" }, Object.entries(r.distributions).map(([name, d]) =>
      el("div", {}, histogramPlot(name, d), el("div", { class: "muted" }, `${METRIC_NAME[name] || name}: mean ${fmt(d.mean)}, median ${fmt(d.median)}`)))),
    el("h3", {}, "Tokens with extreme trajectories"),
    r.extreme_tokens.length ? el("ul", { id: "depth-extremes" }, r.extreme_tokens.map(extremeToken))
      : el("p", { class: "muted" }, "none recorded"),
    el("h3", {}, "Features of the joined SAEs"),
    r.features.length ? joinedFeatures(r.features)
      : el("p", { class: "muted", id: "depth-no-join" }, "No SAE joined (", el("code", {}, "analyze depth --sae IDS"), ")."),
  ];
}

// A pair run: A's layers against B's by CKA and, read at the same layers, B's ID minus A's.
function pairRun(r) {
  const p = r.parameters, s = r.summary, rows = r.shift, layers = rows.map((x) => x.layer);
  const moved = (name) => rows.filter((x) => x[`${name}_shift_p`] < 0.05).map((x) => x.layer);
  const shiftPlot = (name, title) => el("div", {}, el("h3", {}, title), depthPlot(`depth-shift-${name}`, layers, [
    { key: "a", name: `A: ${p.model}`, values: column(rows, `${name}_a`), colour: "#1f77b4", dots: true },
    { key: "b", name: `B: ${p.model_b}`, values: column(rows, `${name}_b`), colour: "#ff7f0e", dots: true }], "dimension"),
  depthPlot(`depth-shift-${name}-delta`, layers, [{ key: "shift", name: "B minus A (paired bootstrap interval)",
    values: column(rows, `${name}_shift`), colour: "#2ca02c", dots: true,
    band: [column(rows, `${name}_shift_low`), column(rows, `${name}_shift_high`)] }], "shift"),
  el("p", { class: "muted" }, `layers where the shift has p < 0.05: ${moved(name).join(", ") || "none"}`));
  return [
    el("p", { id: "depth-headline" }, `A = ${p.model}, B = ${p.model_b}, on the same ${fmt(s.n_tokens)} tokens `,
      `(${fmt(s.n_subsampled)} paired for the dimensions; aligned by ${p.aligned_by}).`),
    el("h3", {}, "CKA of every layer of A against every layer of B"),
    r.cka ? ckaHeatMap(r.cka, "layer of A", "layer of B") : "",
    rows.length ? el("div", { class: "plots", id: "depth-shift" }, shiftPlot("mle", "MLE dimension, A and B"),
      shiftPlot("lid", "Mean local dimension, A and B"))
      : el("p", { class: "muted" }, s.shift || "no shift computed"),
  ];
}

function familiesRun(r) {
  const colour = (i) => PALETTE[i % PALETTE.length];
  return [
    el("p", { id: "depth-headline" }, `${r.families.length} prompt families over layers ${r.layers[0]}–${r.layers[r.layers.length - 1]}; `,
      "each pair compared per metric with a permutation test (prompts permuted)."),
    el("div", { class: "plots" },
      el("div", {}, el("h3", {}, "Local dimension against depth, per family"), depthPlot("family-lid", r.layers,
        r.families.map((f, i) => ({ key: `family-${i}`, name: `${f.family} (${f.n_prompts})`, values: f.lid, colour: colour(i), dots: true })),
        "mean local ID of the family's tokens"))),
    el("h3", {}, "Trajectory means per family"),
    el("div", { id: "family-means" }, table(["family", "n_prompts", "convergence_index", "curvature", "path_length"], r.families)),
    el("h3", {}, "Pairwise tests (smallest p first)"),
    el("div", { id: "family-tests" }, table(["family_a", "family_b", "metric", "mean_a", "mean_b", "p_value"], r.family_tests, {
      p_value: (t) => el("span", { class: t.p_value < 0.05 ? "family-p small" : "family-p" }, fmt(t.p_value)) })),
  ];
}

async function depthView(run) {
  const [runs, r] = await Promise.all([api("/depth"), api(`/depth/${enc(run)}`)]);
  const pick = el("select", { id: "depth-pick" }, runs.filter((x) => x.status === "ok").map((x) =>
    el("option", x.run === run ? { value: x.run, selected: "" } : { value: x.run }, `${x.run} (${x.kind})`)));
  pick.onchange = () => { location.hash = `#/depth/${enc(pick.value)}`; };
  const params = r.parameters;
  view.replaceChildren(
    el("h2", { id: "depth-title" }, `Depth / ${run}`),
    el("div", {}, "run ", pick, " ", el("span", { class: "muted" },
      `${params.model || ""}${params.model_b ? " vs " + params.model_b : ""} · ${r.kind === "families" ? params.families_file || "families" : params.corpus || ""}`)),
    ...({ families: familiesRun, pair: pairRun }[r.kind] || corpusRun)(r),
    r.figures.length ? el("div", {}, el("h3", {}, "Stored figures"), await figureImages(run, r.figures)) : "",
    el("details", {}, el("summary", {}, "all runs"), runTable(runs, run)),
    el("details", {}, el("summary", {}, "parameters and summary"), el("pre", {}, JSON.stringify({ parameters: params, summary: r.summary }, null, 2))));
}

// The feature page's card: where the feature fires in depth terms, per depth run joining its SAE.
function featureDepthCard(rows) {
  if (!rows || !rows.length) return "";
  return el("div", { class: "card", id: "feature-depth" }, el("h3", {}, "Where it fires across depth"),
    rows.map((d) => el("p", { class: `feature-depth ${d.shape}` },
      el("a", { class: "feat", href: `#/depth/${enc(d.run)}` }, d.run), ": ", d.says)));
}

window.depthListView = depthListView;
window.depthView = depthView;
window.featureDepthCard = featureDepthCard;
})();
