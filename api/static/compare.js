// Compare page (#/compare): stored comparisons of two SAEs (GET /compare) and stored crosscoders
// (GET /crosscoders). A comparison (#/compare/<run>) shows its scores beside their nulls, one
// point per Hungarian pair (activation correlation against decoder cosine, or against rank when
// the SAEs share no d_model), the pairs' correlation histogram beside the rotation null's, and a
// click on a pair shows the two latents' feature cards side by side, each read from its own atlas
// (GET /compare/<run>/<side>/features/<latent>). A crosscoder (#/crosscoders/<id>) shows the
// relative-norm histogram of its latents (Lindsey et al. 2024) with the A-only / B-only bands,
// its latents filtered by class, and a click on one its card: both decoder norms, any Latent
// Scaling values and the nearest atlas features per side. Uses app.js's helpers (api, el, fmt,
// enc, featLink, highlighted, table; svg.js's svg, linear and axes); only `compareListView`,
// `compareView` and `crosscoderView` are global.
(function () {
"use strict";

const CLASS_COLOUR = { a_only: "#d6604d", shared: "#999999", b_only: "#4393c3" };
const CLASS_NAME = { a_only: "A only", shared: "shared", b_only: "B only" };

// Where a correlation or cosine axis ending at 1 starts: the values' minimum down to a multiple of 0.1 (at most 0.9).
const axisStart = (values) => Math.min(0.9, values.length ? Math.floor(Math.min(...values) * 10 + 1e-9) / 10 : 0);

// --- the listing ------------------------------------------------------------------------------
// A run that is not "ok" (damaged, or unregistered: GET /compare/<run> refuses both) is listed
// without a link, with its status and the problem (the file, or the command that repairs it).
async function compareListView() {
  const [runs, crosscoders] = await Promise.all([api("/compare"), api("/crosscoders")]);
  view.replaceChildren(el("h2", {}, "Comparisons of two SAEs"),
    runs.length ? table(["run", "sae_a", "sae_b", "atlas_b", "n_tokens", "mcc", "mcc_null", "decoder_mcc", "status"], runs, {
      run: (r) => (r.status === "ok" ? el("a", { class: "feat compare-run", href: `#/compare/${enc(r.run)}` }, r.run)
        : el("span", { class: `compare-run-off ${r.status}`, "data-run": r.run }, r.run)),
      status: (r) => (r.status === "ok" ? "ok" : el("span", { class: `error compare-problem ${r.status}`, "data-run": r.run,
        title: r.problem }, `${r.status}: ${r.problem}`)) })
      : el("p", { class: "muted" }, "No comparisons yet (sae-atlas compare A[:SAE] B[:SAE])."),
    el("h2", {}, "Crosscoders"),
    crosscoders.length ? table(["crosscoder", "hook_a", "model_b", "hook_b", "d_sae", "a_only", "shared", "b_only"], crosscoders, {
      crosscoder: (r) => el("a", { class: "feat crosscoder-id", href: `#/crosscoders/${enc(r.crosscoder)}` }, r.crosscoder) })
      : el("p", { class: "muted" }, "No crosscoders yet (sae-atlas train-crosscoder)."));
}

// --- one comparison ---------------------------------------------------------------------------------
function scoreRows(result) {
  const s = result.summary;
  const rows = [{ score: "MCC (activation correlation)", value: s.mcc, null_mean: s.mcc_null?.null_mean,
    null_std: s.mcc_null?.null_std, p_value: s.mcc_null?.p_value, against: "rotation of B's codes" }];
  if (s.decoder_mcc_null) rows.push({ score: "MCC (decoder cosine)", value: s.decoder_mcc_null.score,
    null_mean: s.decoder_mcc_null.null_mean, null_std: s.decoder_mcc_null.null_std, p_value: s.decoder_mcc_null.p_value,
    against: "random directions" });
  for (const r of result.spaces) rows.push({ score: `${r.score_name.toUpperCase()} (${r.space})`, value: r.score,
    null_mean: r.null_mean, null_std: r.null_std, p_value: r.p_value, against: r.null.replace(/_/g, " ") });
  rows.push({ score: "mutual nearest pairs", value: s.n_mutual, against: "" },
    { score: "mean max corr A→B / B→A", value: `${fmt(s.mean_max_a)} / ${fmt(s.mean_max_b)}`, against: "" });
  return rows;
}

function pairScatter(pairs, onPick) {
  const W = 460, H = 320, box = { W, H, left: 48, bottom: 34, top: 14, right: 12 };
  const byCosine = pairs.length > 0 && pairs.every((p) => p.decoder_cos !== null);
  const xs = pairs.map((p, i) => (byCosine ? p.decoder_cos : i));
  const ys = pairs.map((p) => p.corr ?? 0);
  const sx = byCosine ? linear(axisStart(xs), 1, box.left, W - box.right)
    : linear(0, Math.max(1, xs.length - 1), box.left, W - box.right);
  const sy = linear(axisStart(ys), 1, H - box.bottom, box.top);
  const plot = svg("svg", { id: "pair-scatter", width: W, height: H, "data-points": pairs.length,
    "data-x": byCosine ? "decoder_cos" : "rank" });
  axes(plot, sx, sy, box, byCosine ? "decoder cosine" : "pair rank (no shared d_model)", "activation correlation");
  pairs.map((p, i) => [p, i]).reverse().forEach(([p, i]) => {  // the best pairs drawn last, on top
    const dot = svg("circle", { class: "pair-point" + (p.mutual ? " mutual" : ""), cx: sx(xs[i]), cy: sy(ys[i]), r: 3.5,
      "data-a": p.a_latent, "data-b": p.b_latent, fill: p.mutual ? "#2166ac" : "none", stroke: "#2166ac" },
    svg("title", {}, `A ${p.a_latent}${p.a_label ? ` (${p.a_label})` : ""} ↔ B ${p.b_latent}${p.b_label ? ` (${p.b_label})` : ""}`
      + `: corr ${fmt(p.corr)}` + (byCosine ? `, cosine ${fmt(p.decoder_cos)}` : "") + (p.mutual ? " (mutual)" : "")));
    dot.onclick = () => onPick(p);
    plot.append(dot);
  });
  return plot;
}

// Mark the picked pair's point.
function markPair(plot, pair) {
  plot.querySelectorAll(".pair-point").forEach((c) => {
    const picked = c.dataset.a === String(pair.a_latent) && c.dataset.b === String(pair.b_latent);
    c.classList.toggle("picked", picked);
    c.setAttribute("r", picked ? 6 : 3.5);
  });
}

// The pairs' correlations beside the rotation null's, each as a fraction of its own count.
function correlationHistogram(h) {
  const W = 460, H = 320, box = { W, H, left: 48, bottom: 34, top: 14, right: 12 };
  const total = (c) => Math.max(1, c.reduce((a, b) => a + b, 0));
  const [pairs, nul] = [h.pairs.map((c) => c / total(h.pairs)), h.null.map((c) => c / total(h.null))];
  const sx = linear(h.edges[0], h.edges[h.edges.length - 1], box.left, W - box.right);
  sx.ticks = [h.edges[0], 0, 0.5, 1].filter((t, i, all) => all.indexOf(t) === i);
  const sy = linear(0, Math.max(1e-9, ...pairs, ...nul), H - box.bottom, box.top);
  const plot = svg("svg", { id: "corr-hist", width: W, height: H, "data-bins": pairs.length });
  axes(plot, sx, sy, box, "activation correlation of a matched pair", "fraction of pairs");
  for (const [values, cls, colour] of [[nul, "null-bar", "#bbbbbb"], [pairs, "pair-bar", "#2166ac"]]) {
    values.forEach((v, i) => {
      if (!v) return;
      const x0 = sx(h.edges[i]), x1 = sx(h.edges[i + 1]);
      plot.append(svg("rect", { class: cls, x: x0, y: sy(v), width: Math.max(1, x1 - x0 - 1), height: sy(0) - sy(v),
        fill: colour, "fill-opacity": cls === "null-bar" ? 0.8 : 0.55 }, svg("title", {}, `${fmt(h.edges[i])}–${fmt(h.edges[i + 1])}: ${fmt(v)}`)));
    });
  }
  return plot;
}

// A compact feature card (label, statistics, top examples, logit effects) of one side's latent.
async function sideCard(run, side, latent, title, href) {
  const card = el("div", { class: "card side-card", id: `card-${side}`, "data-latent": latent });
  card.append(el("h3", {}, href ? el("a", { class: "feat", href }, title) : title));
  try {
    const f = await api(`/compare/${enc(run)}/${side}/features/${latent}?examples=4&neighbours=3`);
    const s = f.stats;
    card.append(
      f.label ? el("p", { class: "card-label" }, el("b", {}, "label "), f.label) : el("p", { class: "muted" }, "no label"),
      el("table", { class: "stats" }, ["density", "max_act", "mean_active_act"].map((k) => el("tr", {}, el("td", {}, k), el("td", {}, fmt(s[k]))))),
      el("div", { class: "card-examples" }, f.examples.length
        ? f.examples.map((e) => el("div", { class: "example" }, highlighted(e.tokens, e.acts, s.max_act, e.centre)))
        : el("span", { class: "muted" }, "never fired on the held-out tokens")),
      el("p", {}, el("b", {}, "promotes "), f.top_logits.slice(0, 5).map((t) => el("code", {}, (t.token ?? t.token_id) + " "))));
  } catch (err) {
    card.append(el("p", { class: "error card-error" }, err.message));
  }
  return card;
}

async function compareView(run) {
  const result = await api(`/compare/${enc(run)}?pairs=500`);
  const p = result.parameters;
  const sameAtlas = p.atlas_a === p.atlas_b;
  const cards = el("div", { class: "grid", id: "pair-cards" }, el("p", { class: "muted" }, "Click a pair for both latents' feature cards."));
  const scatter = pairScatter(result.pairs, (pair) => pick(pair));
  const pick = async (pair) => {
    markPair(scatter, pair);
    cards.replaceChildren(...await Promise.all([
      sideCard(run, "a", pair.a_latent, `A: ${p.sae_a} / ${pair.a_latent}`, featureHref(p.sae_a, pair.a_latent)),
      sideCard(run, "b", pair.b_latent, `B: ${p.sae_b} / ${pair.b_latent}` + (sameAtlas ? "" : ` (atlas ${p.atlas_b})`),
        sameAtlas ? featureHref(p.sae_b, pair.b_latent) : null)]));
    cards.dataset.pair = `${pair.a_latent}-${pair.b_latent}`;
  };
  view.replaceChildren(
    el("h2", { id: "compare-title" }, `${p.sae_a} vs ${p.sae_b}`),
    el("p", { class: "muted" }, `A: ${p.hook_a} of ${p.model_a} · B: ${p.hook_b} of ${p.model_b}`
      + (sameAtlas ? "" : ` (atlas ${p.atlas_b})`) + ` · ${fmt(result.summary.n_tokens)} tokens · `,
      el("a", { href: "#/compare" }, "all comparisons")),
    el("h3", {}, "Scores beside their nulls"),
    el("div", { id: "compare-scores" }, table(["score", "value", "null_mean", "null_std", "p_value", "against"], scoreRows(result))),
    ...(result.notes || []).map((n) => el("p", { class: "muted p-note" }, n)),
    el("div", { class: "grid" },
      el("div", {}, el("h3", {}, `Matched pairs (${result.pairs.length} best; filled: mutual)`), scatter),
      el("div", {}, el("h3", {}, "Pair correlations vs rotation null"), correlationHistogram(result.correlations),
        el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:#2166ac" }), "Hungarian pairs"),
          el("span", {}, el("i", { style: "background:#bbbbbb" }), "after a random rotation of B")))),
    cards,
    el("h3", {}, "Best matched pairs"), pairTable(result.pairs.slice(0, 20), pick));
}

function pairTable(pairs, pick) {
  const shown = table(["a_latent", "a_label", "b_latent", "b_label", "corr", "decoder_cos", "mutual"], pairs,
    { a_label: (r) => r.a_label ?? "", b_label: (r) => r.b_label ?? "" });
  shown.id = "pair-table";
  shown.querySelectorAll("tr").forEach((tr, i) => {
    if (i === 0) return;
    tr.className = "pair-row";
    tr.onclick = () => pick(pairs[i - 1]);
  });
  return shown;
}

// --- one crosscoder -------------------------------------------------------------------------------------
// Counts of latents by relative norm, stacked by class, with the A-only and B-only bands shaded;
// `log`: heights by log10(1 + count), so that a few A-only or B-only latents show beside the shared peak.
function relativeNormHistogram(h, log) {
  const W = 720, H = 260, box = { W, H, left: 48, bottom: 34, top: 20, right: 12 };
  const classes = ["a_only", "shared", "b_only"];
  const totals = h.shared.map((_, i) => classes.reduce((a, c) => a + h[c][i], 0));
  const sx = linear(0, 1, box.left, W - box.right, 0.1);
  const height = log ? (n) => Math.log10(1 + n) : (n) => n;
  const sy = linear(0, height(Math.max(1, ...totals)), H - box.bottom, box.top);
  if (log) sy.label = (t) => fmt(Math.round(10 ** t - 1));
  const plot = svg("svg", { id: "cc-hist", width: W, height: H, "data-latents": totals.reduce((a, b) => a + b, 0),
    "data-bins": totals.length, "data-log": String(Boolean(log)) });
  plot.append(svg("rect", { class: "band a_only", x: sx(0), y: box.top, width: sx(h.a_only_below) - sx(0), height: H - box.bottom - box.top,
    fill: CLASS_COLOUR.a_only, "fill-opacity": 0.08 }),
    svg("rect", { class: "band b_only", x: sx(h.b_only_above), y: box.top, width: sx(1) - sx(h.b_only_above),
      height: H - box.bottom - box.top, fill: CLASS_COLOUR.b_only, "fill-opacity": 0.08 }));
  for (const x of [h.a_only_below, h.b_only_above]) {
    plot.append(svg("line", { x1: sx(x), x2: sx(x), y1: box.top, y2: H - box.bottom, class: "threshold" }));
  }
  plot.append(svg("text", { x: sx(h.a_only_below / 2), y: box.top - 5, class: "label", "text-anchor": "middle" }, "A only"),
    svg("text", { x: sx((1 + h.b_only_above) / 2), y: box.top - 5, class: "label", "text-anchor": "middle" }, "B only"));
  axes(plot, sx, sy, box, "relative decoder norm: norm B / (norm A + norm B)", log ? "latents (log scale)" : "latents");
  totals.forEach((_, i) => {
    let base = 0;
    const x0 = sx(h.edges[i]), width = Math.max(1, sx(h.edges[i + 1]) - x0 - 1);
    for (const c of classes) {
      const n = h[c][i];
      if (!n) continue;
      plot.append(svg("rect", { class: `bin ${c}`, "data-count": n, x: x0, y: sy(height(base + n)), width,
        height: sy(height(base)) - sy(height(base + n)),
        fill: CLASS_COLOUR[c] }, svg("title", {}, `${fmt(h.edges[i])}–${fmt(h.edges[i + 1])}: ${n} ${CLASS_NAME[c]}`)));
      base += n;
    }
  });
  return plot;
}

function nearestTable(rows, side) {
  return el("div", { class: `nearest nearest-${side}` }, table(["feature", "cosine", "label"], rows, {
    feature: (r) => featLink(r.sae_id, r.latent, `${r.sae_id} / ${r.latent}`), label: (r) => r.label ?? "" }));
}

async function crosscoderCard(id, latent) {
  const c = await api(`/crosscoders/${enc(id)}/latents/${latent}?k=5`);
  const values = [["decoder norm, side A", c.norm_a], ["decoder norm, side B", c.norm_b],
    ["relative norm", c.relative_norm], ["class", CLASS_NAME[c.latent_class]], ...Object.entries(c.scaling)];
  return el("div", { class: "card", id: "cc-card", "data-latent": latent },
    el("h3", {}, `latent ${latent}`, el("span", { class: `cc-class ${c.latent_class}` }, ` ${CLASS_NAME[c.latent_class]}`)),
    el("table", { class: "stats", id: "cc-norms" }, values.map(([k, v]) => el("tr", { "data-key": k }, el("td", {}, k), el("td", {}, fmt(v))))),
    el("h3", {}, `Nearest features at ${c.crosscoder.hook_a} (side A's decoder row)`),
    c.nearest_a ? nearestTable(c.nearest_a, "a") : el("span", { class: "muted" }, "none to compare"),
    el("h3", {}, `Nearest features at ${c.crosscoder.hook_b} (side B's decoder row)`),
    c.nearest_b ? nearestTable(c.nearest_b, "b") : el("span", { class: "muted" }, "none to compare"),
    c.notes.map((n) => el("p", { class: "muted cc-note" }, n)));
}

async function crosscoderView(id) {
  const state = { latent_class: "", sort: "relative_norm", descending: true };
  const classSelect = el("select", { id: "cc-class" }, [["", "all latents"], ["a_only", "only in A"], ["shared", "shared"],
    ["b_only", "only in B"]].map(([v, label]) => el("option", { value: v }, label)));
  const sortSelect = el("select", { id: "cc-sort" });
  const logScale = el("input", { id: "cc-log", type: "checkbox" });
  const histogram = el("div", { id: "cc-hist-box" });
  const order = el("select", { id: "cc-order" }, el("option", { value: "desc" }, "largest first"), el("option", { value: "asc" }, "smallest first"));
  const list = el("div", { id: "cc-list" });
  const card = el("div", { id: "cc-card-box" }, el("p", { class: "muted" }, "Click a latent for its card."));
  const load = async () => {
    const query = new URLSearchParams({ sort: state.sort, descending: String(state.descending), limit: "200" });
    if (state.latent_class) query.set("latent_class", state.latent_class);
    const page = await api(`/crosscoders/${enc(id)}/latents?${query}`);
    const extra = page.rows.length ? Object.keys(page.rows[0].scaling) : [];
    if (!sortSelect.options.length) {
      for (const c of ["relative_norm", "norm_a", "norm_b", "latent", ...extra]) sortSelect.append(el("option", { value: c }, c));
    }
    const rows = page.rows.map((r) => ({ ...r, ...r.scaling }));
    const shown = table(["latent", "norm_a", "norm_b", "relative_norm", "latent_class", ...extra], rows, {
      latent_class: (r) => el("span", { class: `cc-class ${r.latent_class}` }, CLASS_NAME[r.latent_class]) });
    shown.id = "cc-latents";
    shown.querySelectorAll("tr").forEach((tr, i) => {
      if (i === 0) return;
      const latent = rows[i - 1].latent;
      tr.dataset.latent = latent;
      tr.dataset.class = rows[i - 1].latent_class;
      tr.className = "cc-row";
      tr.onclick = async () => {
        try { card.replaceChildren(await crosscoderCard(id, latent)); } catch (err) { card.replaceChildren(el("p", { class: "error" }, err.message)); }
      };
    });
    list.replaceChildren(el("p", { class: "muted", id: "cc-total" },
      `${page.total} ${state.latent_class ? CLASS_NAME[state.latent_class] : ""} latents` + (page.total > rows.length ? ` (first ${rows.length})` : "")), shown);
    return page;
  };
  classSelect.onchange = () => { state.latent_class = classSelect.value; load(); };
  sortSelect.onchange = () => { state.sort = sortSelect.value; load(); };
  order.onchange = () => { state.descending = order.value === "desc"; load(); };
  const page = await load();
  const x = page.crosscoder;
  logScale.onchange = () => histogram.replaceChildren(relativeNormHistogram(page.histogram, logScale.checked));
  logScale.onchange();
  view.replaceChildren(
    el("h2", { id: "cc-title" }, `crosscoder ${id}`),
    el("p", { class: "muted" }, `A: ${x.hook_a} of ${x.model_a} · B: ${x.hook_b} of ${x.model_b} · ${x.d_sae} latents, k ${x.k}, `
      + `${fmt(x.n_tokens)} tokens · `, el("a", { href: "#/compare" }, "all comparisons")),
    el("h3", {}, `Relative decoder norms: ${x.a_only} only in A, ${x.shared} shared, ${x.b_only} only in B`),
    histogram, el("label", {}, logScale, " log scale"),
    el("div", {}, "show ", classSelect, " sorted by ", sortSelect, " ", order),
    el("div", { class: "grid cc-grid" }, list, card));
}

window.compareListView = compareListView;
window.compareView = compareView;
window.crosscoderView = crosscoderView;
})();
