// sae-atlas explorer: a small hash-routed page over the HTTP API (no external resources).
"use strict";

const view = document.getElementById("view");
const statusEl = document.getElementById("status");
const state = { saes: null };

// --- API access (optional bearer token from ?token=... or localStorage) ----------------
(function readToken() {
  const params = new URLSearchParams(location.search);
  if (params.get("token")) localStorage.setItem("sae-atlas-token", params.get("token"));
})();

function authHeaders() {
  const token = localStorage.getItem("sae-atlas-token");
  return token ? { Authorization: "Bearer " + token } : {};
}

async function api(path, body) {
  const options = { headers: { Accept: "application/json", ...authHeaders() } };
  if (body !== undefined) {
    options.method = "POST";
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  statusEl.textContent = "loading...";
  const response = await fetch(path, options);
  statusEl.textContent = "";
  if (response.status === 401) {
    const token = prompt("This atlas needs a token:");
    if (token) { localStorage.setItem("sae-atlas-token", token); return api(path, body); }
  }
  const data = await response.json().catch(() => ({ detail: response.statusText }));
  if (!response.ok) throw new Error(data.detail || response.statusText);
  return data;
}

async function saes() {
  if (!state.saes) state.saes = await api("/saes");
  return state.saes;
}

async function health() {
  if (!state.health) state.health = await api("/health");
  return state.health;
}

// A notice (shown before any click) for what this server cannot do: `command` is what makes it possible.
const needs = (id, text, command) => el("div", { class: "notice", id }, text, " ", el("code", {}, command),
  command.includes("<atlas>") ? el("span", { class: "muted" }, " (<atlas>: the atlas directory this server serves)") : "");

// null when the server lets the model run, else the notice naming the restart command.
async function interventionsOff(what) {
  if ((await health()).interventions_allowed) return null;
  return needs("needs-interventions", `${what} runs the model, which this server does not allow. Restart it with`,
    "sae-atlas serve <atlas> --allow-interventions");
}

// --- small DOM helpers ---------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "onclick" || key === "onchange") node[key] = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const fmt = (x) => (x === null || x === undefined ? "–" : typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toPrecision(3)) : String(x));
const enc = encodeURIComponent;
const featureHref = (sae, i) => `#/saes/${enc(sae)}/features/${i}`;
const featLink = (sae, i, label) => el("a", { class: "feat", href: featureHref(sae, i) }, label || `${sae} / ${i}`);

function showError(err) {
  view.replaceChildren(el("div", { class: "error", id: "error" }, String(err.message || err)));
}

function table(columns, rows, render = {}) {
  return el("table", {},
    el("tr", {}, columns.map((c) => el("th", {}, c))),
    rows.map((r) => el("tr", {}, columns.map((c) => el("td", {}, render[c] ? render[c](r) : fmt(r[c]))))));
}

function saeSelect(list, selected, id) {
  const select = el("select", { id });
  for (const s of list) {
    const option = el("option", { value: s.sae_id }, s.sae_id);
    if (s.sae_id === selected) option.selected = true;
    select.append(option);
  }
  return select;
}

// Token highlighting: background opacity = activation / scale.
function highlighted(tokens, acts, scale, centre) {
  const top = scale || Math.max(1e-9, ...acts.map((a) => a || 0));
  return tokens.map((tok, i) => {
    const alpha = Math.max(0, Math.min(1, (acts[i] || 0) / top));
    return el("span", { class: "t" + (i === centre ? " centre" : ""), title: fmt(acts[i] || 0),
      style: `background: rgba(255,140,0,${alpha.toFixed(2)})` }, tok);
  });
}

// --- text view -------------------------------------------------------------------------------
async function textView() {
  const list = await saes();
  const input = el("textarea", { id: "text-input", placeholder: "Type a text to see which features fire on each token" });
  input.value = sessionStorage.getItem("sae-atlas-text") || "";
  const select = saeSelect(list, sessionStorage.getItem("sae-atlas-sae"), "text-sae");
  const special = el("input", { id: "text-special", type: "checkbox" });
  const out = el("div", { id: "text-results" });
  const run = async () => {
    sessionStorage.setItem("sae-atlas-text", input.value);
    sessionStorage.setItem("sae-atlas-sae", select.value);
    out.replaceChildren(el("span", { class: "muted" }, "running the model..."));
    try {
      const result = await api("/search/text", { text: input.value, saes: [select.value], k: 8,
        include_special: special.checked });
      renderTextResult(out, result, select.value);
    } catch (err) {
      out.replaceChildren(el("div", { class: "error" }, err.message));
    }
  };
  view.replaceChildren(
    el("h2", {}, "Which features fire on this text?"), input,
    el("div", {}, "SAE ", select, " ", el("label", { title: "BOS and the model's other special tokens" }, special,
      " special tokens"), " ", el("button", { id: "run-text", onclick: run }, "Run")), out);
  if (input.value) run();
}

function renderTextResult(out, result, sae) {
  const perToken = result.features[sae];
  const tops = perToken.map((f) => (f.length ? f[0].act : 0));
  const real = tops.map((t, i) => (result.special[i] ? 0 : t));  // special tokens never set the scale or selection
  const scale = Math.max(1e-9, ...real);
  const detail = el("div", { id: "token-features" });
  const tokenRow = el("div", { class: "tokens" });
  const select = (i) => {
    tokenRow.querySelectorAll(".tok").forEach((t, j) => t.classList.toggle("selected", i === j));
    detail.replaceChildren(
      el("h3", {}, `token ${result.positions[i]}: "${result.tokens[i]}"`),
      perToken[i].length
        ? table(["latent", "label", "act"], perToken[i], { latent: (r) => featLink(sae, r.latent, `feature ${r.latent}`),
          label: (r) => r.label || "" })
        : el("span", { class: "muted" }, "no active features"));
  };
  result.tokens.forEach((tok, i) => {
    const alpha = Math.min(1, tops[i] / scale).toFixed(2);
    tokenRow.append(el("span", { class: "tok", style: `background: rgba(255,140,0,${alpha})`,
      title: perToken[i].map((f) => `${f.latent}: ${fmt(f.act)}${f.label ? " · " + f.label : ""}`).join("\n"),
      onclick: () => select(i) }, tok));
  });
  out.replaceChildren(el("p", { class: "muted" }, "Click a token for its features."), tokenRow, detail);
  const best = real.indexOf(Math.max(...real));
  select(best >= 0 ? best : 0);
}

// --- SAE list and feature list ----------------------------------------------------------------
async function saesView() {
  // FVU and L0 from the suite's `core` results (what the Board shows); atlas.json's record where there are none.
  const core = Object.fromEntries((await api("/board")).rows.map((r) => [r.sae_id, r.metrics]));
  const list = (await saes()).map((r) => {
    const m = core[r.sae_id] || {};
    return m["core/fvu"] == null ? r : { ...r, fvu: m["core/fvu"], l0: m["core/l0"] };
  });
  const problems = list.filter((r) => r.status !== "ok");
  view.replaceChildren(el("h2", {}, "SAEs"),
    problems.length ? el("div", { id: "sae-problems" }, problems.map((r) =>
      el("p", { class: `error ${r.status}` }, el("b", {}, `${r.sae_id} (${r.status}) `), r.problem))) : "",
    el("p", { class: "muted" }, "fvu and l0: the held-out `core` eval (the Board's numbers) where it ran, else training's held-out check."),
    table(["sae_id", "hook", "architecture", "d_in", "d_sae", "k", "fvu", "l0", "source"], list, {
      sae_id: (r) => el("span", {}, el("a", { class: "feat", href: `#/saes/${enc(r.sae_id)}` }, r.sae_id),
        r.suspect ? el("span", { class: "suspect", title: "imported with --force despite the misload guard" }, " suspect") : "",
        r.status !== "ok" ? el("span", { class: `suspect ${r.status}`, title: r.problem }, ` ${r.status}`) : ""),
      fvu: (r) => (r.fvu === null ? "" : fmt(r.fvu)), k: (r) => (r.k === null ? "" : r.k),
      l0: (r) => (r.l0 === null ? "" : fmt(r.l0)) }));
}

async function featureListView(sae) {
  const page = await api(`/saes/${enc(sae)}/features?sort=density&limit=200`);
  view.replaceChildren(el("h2", {}, sae),
    el("p", {}, el("a", { href: `#/map/${enc(sae)}` }, "map of this SAE"), ` · ${page.total} latents, most frequent first`),
    table(["latent", "label", "density", "mean_active_act", "max_act"], page.rows,
      { latent: (r) => featLink(sae, r.latent, `feature ${r.latent}`), label: (r) => r.label || "" }));
}

// --- feature page ---------------------------------------------------------------------------
async function featureView(sae, index) {
  const f = await api(`/saes/${enc(sae)}/features/${index}?examples=12&neighbours=10`);
  const s = f.stats;
  const hist = el("canvas", { id: "histogram", width: 460, height: 160 });
  const examples = el("div", { id: "examples" }, f.examples.length
    ? f.examples.map((e) => el("div", { class: "example" }, highlighted(e.tokens, e.acts, s.max_act, e.centre),
      el("span", { class: "muted" }, "  " + fmt(e.act))))
    : el("span", { class: "muted" }, "this latent never fired on the held-out tokens"));
  const logits = (list, cls) => list.map((t) => el("div", {}, el("code", {}, t.token ?? t.token_id), " ",
    el("span", { class: cls }, (t.value > 0 ? "+" : "") + fmt(t.value))));
  const links = (rows, id) => el("div", { id }, rows === null ? el("span", { class: "muted" }, "no index") :
    table(["feature", "label", "cosine"], rows, { feature: (r) => featLink(r.sae_id, r.latent, r.sae_id === sae ? `feature ${r.latent}` : `${r.sae_id} / ${r.latent}`),
      label: (r) => r.label || "" }));
  const mapNote = f.map_position ? el("a", { href: `#/map/${enc(sae)}?highlight=${index}` },
    `map position (${fmt(f.map_position.x)}, ${fmt(f.map_position.y)})`) : el("span", { class: "muted" }, "no map");
  const info = (await saes()).find((r) => r.sae_id === sae);
  view.replaceChildren(
    el("h2", { id: "feature-title" }, `${sae} / feature ${index}`),
    f.label ? el("p", { id: "feature-label" }, el("b", {}, "label "), f.label) : "",
    ...(f.explanations || []).map((text) => el("p", { class: "explanation" }, el("b", {}, "explanation "), text)),
    info && info.suspect ? el("p", { id: "suspect-mark", class: "suspect" },
      "suspect: this SAE failed the import misload guard and was kept with --force (see its eval.json)") : "",
    info && info.status === "unregistered" ? el("p", { id: "unregistered-mark", class: "suspect" },
      "unregistered: ", info.problem) : "",
    el("p", { class: "muted", id: "feature-hooks" }, f.hook_out ? `reads ${f.hook} · writes ${f.hook_out}` : f.hook,
      " · ", mapNote, " · ",
      index > 0 ? featLink(sae, index - 1, "previous") : "", " ", featLink(sae, index + 1, "next")),
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h3", {}, "Statistics"),
        el("table", { class: "stats" }, ["density", "n_active", "mean_act", "mean_active_act", "max_act", "decoder_norm"]
          .map((k) => el("tr", {}, el("td", {}, k), el("td", {}, fmt(s[k])))))),
      el("div", { class: "card" }, el("h3", {}, "Activation histogram (log bins)"), hist)),
    featureDepthCard(f.depth),
    el("h3", {}, "Top examples"), examples,
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h3", {}, "Promotes"), logits(f.top_logits, "logit-pos")),
      el("div", { class: "card" }, el("h3", {}, "Suppresses"), logits(f.bottom_logits, "logit-neg"))),
    (await health()).interventions_allowed ? steerBox(sae, index, s.max_act) : "",
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h3", {}, "Similar features"), links(f.neighbours, "neighbours")),
      el("div", { class: "card" }, el("h3", {}, "Geometry"), geometryRecords(f.geometry || [])),
      el("div", { class: "card" }, el("h3", {}, "Cross-layer matches"), links(f.cross_layer, "cross-layer"),
        f.damaged_saes ? el("p", { id: "damaged-saes", class: "suspect" }, "left out (damaged): ",
          Object.entries(f.damaged_saes).map(([id, problem]) => el("span", { title: problem }, id + " "))) : "")));
  drawHistogram(hist, f.histogram);
}

function geometryRecords(records) {
  if (!records.length) return el("span", { id: "geometry", class: "muted" }, "in no stored circle, concept span or lobe");
  return el("div", { id: "geometry" }, table(["kind", "name", "run", "period", "score"], records, {
    kind: (r) => r.in_circle ? `${r.kind} (circle)` : r.kind,
    run: (r) => el("a", { href: `#/analyses/${enc(r.kind === "concept" ? "concept_search" : r.kind === "circle" ? "circular" : r.kind === "lobe" ? "lobes" : r.kind)}/${enc(r.run)}` }, r.run),
  }));
}

// --- interventions (server started with --allow-interventions) -------------------------------
function steerBox(sae, index, maxAct) {
  const prompt = el("input", { id: "steer-prompt", type: "text", size: 50, value: "Today is Monday, so tomorrow is" });
  const alpha = el("input", { id: "steer-alpha", type: "number", step: "any", value: String(Number((2 * (maxAct || 2)).toPrecision(3))) });
  const tokens = el("input", { id: "steer-tokens", type: "number", min: 1, max: 64, value: 12 });
  const out = el("div", { id: "steer-result" });
  const run = async () => {
    out.replaceChildren(el("span", { class: "muted" }, "generating..."));
    try {
      const r = await api("/steer", { text: prompt.value, saes: [sae], max_new_tokens: Number(tokens.value),
        edits: [{ kind: "steer", sae, feature: index, alpha: Number(alpha.value) }] });
      out.replaceChildren(
        table(["", "continuation"], [{ "": "baseline", continuation: r.baseline_text }, { "": "edited", continuation: r.edited_text }]),
        el("p", { class: "muted" }, `KL(baseline || edited) ${fmt(r.kl)}`),
        table(["token", "p_baseline", "p_edited"], r.rising.slice(0, 5), { token: (t) => el("code", {}, t.token) }));
    } catch (err) {
      out.replaceChildren(el("div", { class: "error" }, err.message));
    }
  };
  return el("div", { class: "card", id: "steer-box" }, el("h3", {}, "Steer with this feature"),
    el("div", {}, prompt), el("div", {}, "alpha ", alpha, " new tokens ", tokens, " ",
      el("button", { id: "steer-run", onclick: run }, "Generate")), out);
}

function signed(tokens, values) {
  const top = Math.max(1e-12, ...values.map((v) => Math.abs(v)));
  return tokens.map((tok, i) => {
    const a = Math.min(1, Math.abs(values[i]) / top).toFixed(2);
    const rgb = values[i] >= 0 ? "220,50,47" : "38,139,210";
    return el("span", { class: "t", title: fmt(values[i]), style: `background: rgba(${rgb},${a})` }, tok);
  });
}

async function attributeView() {
  const off = await interventionsOff("Attribution");
  if (off) { view.replaceChildren(el("h2", {}, "Which features drive a prediction?"), off); return; }
  const list = await saes();
  const text = el("textarea", { id: "attr-text" });
  text.value = sessionStorage.getItem("sae-atlas-attr-text") || "Today is Monday, so tomorrow is";
  const target = el("input", { id: "attr-target", type: "text", value: sessionStorage.getItem("sae-atlas-attr-target") || " Tuesday" });
  const select = el("select", { id: "attr-sae" }, el("option", { value: "" }, "all SAEs"),
    list.map((s) => el("option", { value: s.sae_id }, s.sae_id)));
  const out = el("div", { id: "attr-results" });
  const run = async () => {
    sessionStorage.setItem("sae-atlas-attr-text", text.value);
    sessionStorage.setItem("sae-atlas-attr-target", target.value);
    out.replaceChildren(el("span", { class: "muted" }, "attributing..."));
    try {
      const r = await api("/attribute", { text: text.value, target: target.value, saes: select.value ? [select.value] : null });
      out.replaceChildren(
        el("p", {}, `logit of "${target.value}" = ${fmt(r.total)} · `, el("b", { id: "attr-complete" },
          r.complete ? "complete" : "incomplete"), ` (parts sum to the total within ${r.tolerance.atol} + ${r.tolerance.rtol}·|total|)`),
        ...Object.entries(r.token_attr).map(([sid, vals]) => el("div", { class: "tokens attr-row" }, el("b", {}, sid + " "), signed(r.tokens, vals))),
        el("h3", {}, "Top features (red: raise the target, blue: lower it)"),
        table(["feature", "attribution", "max_act", "token"], r.features, {
          feature: (f) => featLink(f.sae_id, f.feature), token: (f) => el("code", {}, r.tokens[f.top_position]) }),
        el("h3", {}, "Attribution vs true ablation effect"),
        table(["feature", "attribution", "ablation_effect"], r.verification, { feature: (f) => featLink(f.sae_id, f.feature) }),
        el("p", { class: "muted" }, Object.entries(r.agreement).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ")));
    } catch (err) {
      out.replaceChildren(el("div", { class: "error" }, err.message));
    }
  };
  view.replaceChildren(el("h2", {}, "Which features drive a prediction?"), text,
    el("div", {}, "target token ", target, " ", select, " ", el("button", { id: "attr-run", onclick: run }, "Attribute")), out);
}

async function labelsView(query) {
  const box = el("input", { id: "label-query", type: "search", placeholder: "words, e.g. weekday", value: query || "" });
  const out = el("div", { id: "label-hits" });
  const form = el("form", {}, box, el("button", { type: "submit" }, "Search labels"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); location.hash = `#/labels?q=${encodeURIComponent(box.value)}`; });
  view.replaceChildren(el("h2", {}, "Find features by words"), form, out);
  if (!query) return;
  const hits = await api(`/search/labels?query=${encodeURIComponent(query)}&k=50`);
  out.replaceChildren(hits.length ? table(["feature", "score", "label", "explanations"], hits, {
    feature: (r) => featLink(r.sae_id, r.latent, `${r.sae_id} / ${r.latent}`),
    explanations: (r) => r.explanations.join(" | "),
  }) : el("span", { class: "muted" }, "no label or explanation matches"));
}

function drawHistogram(canvas, histogram) {
  const ctx = canvas.getContext("2d");
  const counts = histogram.counts;
  const first = counts.findIndex((c) => c > 0);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (first < 0) { ctx.fillText("no activations", 10, 20); return; }
  const shown = counts.slice(first);
  const edges = histogram.edges.slice(first);
  const max = Math.max(...shown);
  const w = (canvas.width - 20) / shown.length;
  ctx.fillStyle = "#e8590c";
  shown.forEach((c, i) => {
    const h = (c / max) * (canvas.height - 30);
    ctx.fillRect(10 + i * w, canvas.height - 20 - h, Math.max(1, w - 1), h);
  });
  ctx.fillStyle = "#555";
  ctx.font = "11px sans-serif";
  ctx.fillText(fmt(edges[0]), 10, canvas.height - 5);
  ctx.fillText(fmt(edges[edges.length - 1]), canvas.width - 50, canvas.height - 5);
  ctx.fillText(`max ${max}`, 12, 12);
}

// --- map view -------------------------------------------------------------------------------------
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

async function mapView(sae, highlight, basis = "decoder") {
  const list = await saes();
  sae = sae || list[0]?.sae_id;
  const select = saeSelect(list, sae, "map-sae");
  select.onchange = () => { location.hash = `#/map/${enc(select.value)}`; };
  const canvas = el("canvas", { id: "map-canvas", width: 720, height: 520 });
  const tip = document.getElementById("map-tip") || document.body.appendChild(el("div", { id: "map-tip" }));
  const colourBy = el("select", { id: "map-colour" });
  const query = el("input", { id: "map-search", type: "search", placeholder: "highlight by label words" });
  const note = el("p", { class: "muted", id: "map-note" }, "Hover a point for its latent; click to open the feature.");
  const basisSelect = el("select", { id: "map-basis", title: "kNN overlap: share of each feature's 10 nearest neighbours in the basis kept on the map" });
  basisSelect.onchange = () => mapView(sae, highlight, basisSelect.value);
  view.replaceChildren(el("h2", {}, "Feature map"),
    el("div", {}, "SAE ", select, " basis ", basisSelect, " colour by ", colourBy, " ", query), canvas, note);
  let data;
  try { data = await api(`/saes/${enc(sae)}/map?basis=${enc(basis)}`); } catch (err) {
    note.replaceChildren(el("span", { class: "error" }, err.message));
    return;
  }
  const n = data.latent.length;
  const labelColumns = Object.keys(data).filter((c) => !["basis", "scores", "latent", "x", "y", "knn_overlap", "label"].includes(c));
  const circle = new Set((await api(`/search/geometry?saes=${enc(sae)}&in_circle=true`)).map((r) => r.latent));
  for (const c of [...labelColumns, "in a circle"]) colourBy.appendChild(el("option", { value: c }, c));
  for (const [b, s] of Object.entries(data.scores)) {  // each basis with how faithful its map is
    const other = s.other_basis_overlap_mean === null ? "" : `, other basis ${fmt(s.other_basis_overlap_mean)}`;
    const score = s.knn_overlap_mean === null ? "" : ` (kNN overlap ${fmt(s.knn_overlap_mean)}${other}; chance ${fmt(s.chance)})`;
    basisSelect.appendChild(el("option", { value: b }, b + score));
  }
  basisSelect.value = basis;
  const overlap = data.knn_overlap.filter((v) => v !== null);
  if (overlap.length) note.append(` kNN overlap of the ${basis} layout: ${fmt(overlap.reduce((a, b) => a + b, 0) / overlap.length)}.`);
  let matches = new Set();
  const [minX, maxX] = [Math.min(...data.x), Math.max(...data.x)];
  const [minY, maxY] = [Math.min(...data.y), Math.max(...data.y)];
  const px = (i) => 20 + ((data.x[i] - minX) / (maxX - minX || 1)) * (canvas.width - 40);
  const py = (i) => canvas.height - 20 - ((data.y[i] - minY) / (maxY - minY || 1)) * (canvas.height - 40);
  const ctx = canvas.getContext("2d");
  const colour = (i) => {
    if (colourBy.value === "in a circle") return circle.has(data.latent[i]) ? "#d62728" : "#ccc";
    const v = data[colourBy.value] ? data[colourBy.value][i] : null;
    return v === null || v === undefined || v < 0 ? "#999" : PALETTE[v % PALETTE.length];
  };
  const draw = () => {
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < n; i++) {
      ctx.fillStyle = colour(i);
      const big = String(data.latent[i]) === highlight || matches.has(data.latent[i]);
      ctx.globalAlpha = matches.size && !big ? 0.25 : 1;
      ctx.beginPath();
      ctx.arc(px(i), py(i), big ? 6 : 3, 0, 2 * Math.PI);
      ctx.fill();
      if (big) { ctx.strokeStyle = "#000"; ctx.stroke(); }
    }
    ctx.globalAlpha = 1;
    if (colourBy.value !== "in a circle" && data[colourBy.value]) {  // name each group at its centre
      const sums = new Map();
      for (let i = 0; i < n; i++) {
        const g = data[colourBy.value][i];
        const [x, y, c] = sums.get(g) || [0, 0, 0];
        sums.set(g, [x + px(i), y + py(i), c + 1]);
      }
      ctx.fillStyle = "#000";
      ctx.font = "11px sans-serif";
      for (const [g, [x, y, c]] of sums) if (g !== null && g >= 0) ctx.fillText(`${colourBy.value} ${g}`, x / c, y / c);
    }
    canvas.dataset.points = String(n);
    canvas.dataset.basis = basis;
    canvas.dataset.highlighted = String(matches.size);
  };
  colourBy.onchange = draw;
  query.onchange = async () => {
    matches = new Set(query.value.trim() ? (await api(`/search/labels?query=${enc(query.value)}&saes=${enc(sae)}&k=100`))
      .map((h) => h.latent) : []);
    draw();
  };
  draw();
  const nearest = (event) => {
    const rect = canvas.getBoundingClientRect();
    const x = event.clientX - rect.left, y = event.clientY - rect.top;
    let best = -1, bestD = 64;
    for (let i = 0; i < n; i++) {
      const d = (px(i) - x) ** 2 + (py(i) - y) ** 2;
      if (d < bestD) { bestD = d; best = i; }
    }
    return best;
  };
  canvas.onmousemove = (event) => {
    const i = nearest(event);
    if (i < 0) { tip.style.display = "none"; return; }
    tip.style.display = "block";
    tip.style.left = event.clientX + 12 + "px";
    tip.style.top = event.clientY + 12 + "px";
    tip.textContent = `latent ${data.latent[i]}` + (data.label?.[i] ? ` · ${data.label[i]}` : "") + labelColumns.map((c) => ` · ${c} ${data[c][i]}`).join("")
      + (circle.has(data.latent[i]) ? " · in a circle" : "");
  };
  canvas.onmouseleave = () => { tip.style.display = "none"; };
  canvas.onclick = (event) => {
    const i = nearest(event);
    if (i >= 0) { tip.style.display = "none"; location.hash = featureHref(sae, data.latent[i]); }
  };
}

// --- geometry results -------------------------------------------------------------------------------
async function analysesView() {
  const runs = await api("/analyses");
  view.replaceChildren(el("h2", {}, "Geometry results"), runs.length ? table(["kind", "run", "figures", "status"], runs, {
    run: (r) => el("a", { class: "feat", href: `#/analyses/${enc(r.kind)}/${enc(r.run)}` }, r.run),
    figures: (r) => r.figures.length,
    status: (r) => (r.status === "ok" ? "ok" : el("span", { class: `error ${r.status}`, title: r.problem }, `${r.status}: ${r.problem}`)) })
    : el("p", { class: "muted" }, "No analyses yet (sae-atlas analyze ...)."));
}

async function analysisView(kind, run) {
  const result = await api(`/analyses/${enc(kind)}/${enc(run)}`);
  const figures = el("div", { class: "figures", id: "figures" });
  for (const name of result.figures) {
    const response = await fetch(`/analyses/${enc(kind)}/figures/${enc(name)}`, { headers: authHeaders() });
    if (response.ok) figures.append(el("img", { alt: name, title: name, src: URL.createObjectURL(await response.blob()) }));
  }
  const rows = result.rows || [];
  view.replaceChildren(el("h2", {}, `${kind} / ${run}`), figures,
    result.columns ? el("div", {}, el("h3", {}, `Table (${result.n_rows} rows)`),
      table(result.columns, rows.slice(0, 200), Object.fromEntries(result.columns.map((c) => [c,
        (r) => (typeof r[c] === "object" && r[c] !== null ? JSON.stringify(r[c]).slice(0, 120) : fmt(r[c]))])))) : null,
    el("h3", {}, "Parameters and summary"), el("pre", {}, JSON.stringify(result.meta, null, 2)));
}

// --- router --------------------------------------------------------------------------------------------
const ROUTES = [
  [/^#\/saes\/([^/]+)\/features\/(\d+)$/, (m) => featureView(decodeURIComponent(m[1]), Number(m[2])), "nav-saes"],
  [/^#\/saes\/([^/]+)$/, (m) => featureListView(decodeURIComponent(m[1])), "nav-saes"],
  [/^#\/saes$/, () => saesView(), "nav-saes"],
  [/^#\/map(?:\/([^/?]+))?(?:\?highlight=(\d+))?$/, (m) => mapView(m[1] && decodeURIComponent(m[1]), m[2]), "nav-map"],
  [/^#\/analyses\/([^/]+)\/([^/]+)$/, (m) => analysisView(decodeURIComponent(m[1]), decodeURIComponent(m[2])), "nav-analyses"],
  [/^#\/analyses$/, () => analysesView(), "nav-analyses"],
  [/^#\/depth\/([^/]+)$/, (m) => depthView(decodeURIComponent(m[1])), "nav-depth"],
  [/^#\/depth$/, () => depthListView(), "nav-depth"],
  [/^#\/labels(?:\?q=(.*))?$/, (m) => labelsView(m[1] && decodeURIComponent(m[1])), "nav-labels"],
  [/^#\/attribute$/, () => attributeView(), "nav-attribute"],
  [/^#\/graph$/, () => graphView(), "nav-graph"],
  [/^#\/board$/, () => boardView(), "nav-board"],
  [/^#\/steering$/, () => steeringView(), "nav-steering"],
  [/^#\/compare\/([^/]+)$/, (m) => compareView(decodeURIComponent(m[1])), "nav-compare"],
  [/^#\/compare$/, () => compareListView(), "nav-compare"],
  [/^#\/crosscoders\/([^/]+)$/, (m) => crosscoderView(decodeURIComponent(m[1])), "nav-compare"],
  [/^(#\/?)?$/, () => textView(), "nav-text"],
];

async function route() {
  const hash = location.hash;
  for (const [pattern, render, nav] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.id === nav));
    try { await render(match); } catch (err) { showError(err); }
    return;
  }
  showError(new Error(`unknown page ${hash}`));
}

window.addEventListener("hashchange", route);
route();
