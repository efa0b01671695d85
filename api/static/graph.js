// Graph page (#/graph): an attribution graph of a prompt's next token (POST /graph) drawn as
// circuit-tracer lays it out: one column per prompt position, one row per layer (token
// embeddings at the bottom, logits at the top), edges as lines whose width is |weight| and
// whose colour is its sign (blue up, red down). Click a feature for its feature page,
// shift-click to pin it, and collapse the graph's supernodes (stored circles, concept spans,
// lobes) into one node with summed edges. Uses app.js's helpers (api, el, fmt, featureHref,
// table, enc, interventionsOff, needs; svg.js's svg). The page opens on the graphs stored in the atlas
// (GET /graphs, `sae-atlas graph ... --store RUN`); building a new one needs --allow-interventions.
// Only `graphView` is global.
(function () {
"use strict";

// Nodes and links with every supernode's members replaced by one node (edges summed, inner ones dropped).
function collapsed(graph) {
  const owner = new Map();
  const nodes = graph.nodes.filter((n) => !graph.qParams.supernodes.some(([, ...ids]) => ids.includes(n.node_id)));
  graph.qParams.supernodes.forEach(([label, ...ids], i) => {
    const members = graph.nodes.filter((n) => ids.includes(n.node_id));
    if (!members.length) return;
    const id = `supernode-${i}`;
    members.forEach((m) => owner.set(m.node_id, id));
    const layer = String(Math.round(members.reduce((s, m) => s + Number(m.layer), 0) / members.length));
    nodes.push({ node_id: id, layer, ctx_idx: Math.max(...members.map((m) => m.ctx_idx)), feature_type: "supernode",
      clerp: label, members: members.map((m) => m.node_id) });
  });
  const sums = new Map();
  for (const link of graph.links) {
    const source = owner.get(link.source) || link.source, target = owner.get(link.target) || link.target;
    if (source === target) continue;
    const key = source + "\u0000" + target;
    sums.set(key, (sums.get(key) || 0) + link.weight);
  }
  const links = [...sums].map(([key, weight]) => { const [source, target] = key.split("\u0000"); return { source, target, weight }; });
  return { nodes, links };
}

function draw(result, options) {
  const graph = result.graph;
  const { nodes, links } = options.collapse ? collapsed(graph) : { nodes: graph.nodes, links: graph.links };
  const tokens = graph.metadata.prompt_tokens;
  // Rows: embeddings, one per dictionary (named by its model layer), logits; circuit-tracer
  // numbers the logit layer one past an empty one, which is not drawn.
  const dicts = (graph.metadata.sae_atlas || {}).dictionaries
    || [...new Set(nodes.filter((n) => n.layer !== "E" && n.feature_type !== "logit").map((n) => Number(n.layer)))]
      .sort((a, b) => a - b).map((layer) => ({ layer }));
  const rowOf = (n) => (n.layer === "E" ? 0 : n.feature_type === "logit" ? dicts.length + 1 : Number(n.layer) + 1);
  const rows = dicts.length + 2;
  const colW = Math.max(70, Math.min(140, 1100 / tokens.length)), rowH = 46, padL = 40, padT = 20;
  const width = padL + colW * tokens.length + 20, height = padT + rowH * rows + 40;
  const cells = new Map();
  for (const n of nodes) {
    const key = rowOf(n) + ":" + n.ctx_idx;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(n);
  }
  const pos = new Map();
  for (const members of cells.values()) {
    members.forEach((n, i) => {
      const x = padL + colW * n.ctx_idx + colW * (i + 1) / (members.length + 1);
      const y = padT + rowH * (rows - 1 - rowOf(n)) + rowH / 2;
      pos.set(n.node_id, [x, y]);
    });
  }
  const top = Math.max(1e-12, ...links.map((l) => Math.abs(l.weight)));
  const plot = svg("svg", { id: "graph-svg", width, height, "data-nodes": nodes.length, "data-links": links.length });
  tokens.forEach((t, i) => plot.append(svg("text", { x: padL + colW * (i + 0.5), y: height - 8, "text-anchor": "middle",
    "font-size": 11 }, t.length > 12 ? t.slice(0, 11) + "…" : t)));
  for (let r = 0; r < rows; r++) plot.append(svg("text", { x: 4, y: padT + rowH * (rows - 1 - r) + rowH / 2 + 4, "font-size": 10,
    fill: "#888", class: "graph-row" }, r === 0 ? "Emb" : r === rows - 1 ? "Lgt" : `L${dicts[r - 1].layer}`));
  for (const l of links) {
    const a = pos.get(l.source), b = pos.get(l.target);
    if (!a || !b) continue;
    plot.append(svg("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: "graph-link", "data-weight": l.weight,
      stroke: l.weight >= 0 ? "#2166ac" : "#b2182b", "stroke-opacity": 0.25 + 0.6 * Math.abs(l.weight) / top,
      "stroke-width": 0.4 + 4 * Math.abs(l.weight) / top }, svg("title", {}, `${l.source} → ${l.target}: ${fmt(l.weight)}`)));
  }
  for (const n of nodes) {
    const [x, y] = pos.get(n.node_id);
    const pinned = options.pinned.has(n.node_id);
    const common = { class: `graph-node ${n.feature_type.replace(/ /g, "-")}${pinned ? " pinned" : ""}`, "data-node": n.node_id,
      stroke: pinned ? "#e08000" : "#333", "stroke-width": pinned ? 3 : 1 };
    const shape = n.feature_type === "cross layer transcoder" ? svg("circle", { ...common, cx: x, cy: y, r: 6, fill: "#fdd49e" })
      : n.feature_type === "supernode" ? svg("circle", { ...common, cx: x, cy: y, r: 10, fill: "#c2a5cf" })
      : n.feature_type.includes("error") ? svg("rect", { ...common, x: x - 5, y: y - 5, width: 10, height: 10, fill: "#ddd", transform: `rotate(45 ${x} ${y})` })
      : svg("rect", { ...common, x: x - 6, y: y - 6, width: 12, height: 12, fill: n.feature_type === "logit" ? "#a6dba0" : "#eee" });
    shape.append(svg("title", {}, `${n.node_id} ${n.clerp || ""}` + (n.activation !== null && n.activation !== undefined ? ` (act ${fmt(n.activation)})` : "")));
    shape.onclick = (event) => {
      if (event.shiftKey) { options.pinned.has(n.node_id) ? options.pinned.delete(n.node_id) : options.pinned.add(n.node_id); options.redraw(); return; }
      if (n.sae_id !== undefined) location.hash = featureHref(n.sae_id, Number(n.node_id.split("_")[1]));
    };
    plot.append(shape);
  }
  return plot;
}

// The graph's summary, drawing and most influential nodes into `out` (redrawn when the collapse box changes).
function show(out, result, collapse) {
  const options = { collapse: false, pinned: new Set(), redraw: () => {} };
  options.redraw = () => {
    options.collapse = collapse.checked;
    const s = result.scores, z = result.size;
    out.replaceChildren(
      el("p", { id: "graph-summary" }, `${result.kind} graph (${result.linear ? "exact direct effects" : "first-order edges"}) of `,
        el("code", {}, result.text), " → ", result.targets.map((t) => `${JSON.stringify(t.token)} p=${fmt(t.prob)}`).join(", "),
        ` · nodes ${z.nodes} → ${z.kept_nodes}, edges ${z.edges} → ${z.kept_edges} · replacement ${fmt(s.replacement)},`
        + ` completeness ${fmt(s.completeness)}`),
      draw(result, options),
      el("p", { id: "graph-pinned" }, options.pinned.size ? `pinned: ${[...options.pinned].join(", ")}` : "shift-click a node to pin it"),
      el("h3", {}, "Most influential nodes"),
      table(["node_id", "sae_id", "latent", "token", "activation", "influence", "label"], result.top_nodes));
  };
  collapse.onchange = () => options.redraw();
  options.redraw();
}

async function graphView() {
  const collapse = el("input", { id: "graph-collapse", type: "checkbox" });
  const out = el("div", { id: "graph-out" });
  const stored = await api("/graphs");
  const storedSelect = el("select", { id: "graph-stored" },
    stored.map((g) => el("option", { value: g.run }, `${g.run}: ${g.text} → ${g.targets.join(", ")}`)));
  const open = async () => {
    try { show(out, await api(`/graphs/${enc(storedSelect.value)}`), collapse); } catch (err) {
      out.replaceChildren(el("div", { class: "error", id: "error" }, String(err.message || err)));
    }
  };
  storedSelect.onchange = open;
  const storeCommand = 'sae-atlas graph <atlas> "Two days from Monday is" --target " Wednesday" --store weekdays';
  const off = await interventionsOff("Building a graph");
  let builder = off;
  if (!off) {
    const prompt = el("input", { id: "graph-prompt", size: 60, value: "the cat sat on the mat and the dog" });
    const target = el("input", { id: "graph-target", size: 14, placeholder: "target token" });
    const build = el("button", { id: "graph-build", onclick: async () => {
      out.replaceChildren(el("span", { class: "muted" }, "building the graph (the model runs; a minute or more on a CPU)..."));
      try {
        const body = { text: prompt.value };
        if (target.value.trim()) body.targets = [target.value];
        show(out, await api("/graph", body), collapse);
      } catch (err) { out.replaceChildren(el("div", { class: "error", id: "error" }, String(err.message || err))); }
    } }, "Build graph");
    builder = el("div", {}, prompt, " ", target, " ", build);
  }
  view.replaceChildren(el("h2", {}, "Attribution graph"),
    el("p", { class: "muted" }, "Direct effects among features, errors, tokens and logits with attention and norms frozen "
      + "(circuit-tracer's method), pruned by influence."),
    stored.length ? "" : needs("needs-graph", "No graph is stored in this atlas yet. Store one with", storeCommand),
    el("div", {}, stored.length ? ["stored graph ", storedSelect, " "] : "", el("label", {}, collapse, " collapse supernodes")),
    builder, out);
  if (stored.length) await open();
}

window.graphView = graphView;
})();
