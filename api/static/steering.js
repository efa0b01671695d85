// Steer page (#/steering): "steer toward" a target token. The SAEs' features ranked by their
// measured effect on the token (GET /steering/search: probability ratio and KL at a calibrated
// strength, the same edit on held-out prompts per style, label, density, the siblings' ratio and
// the target's rank among promoted tokens) and the fitted combination of features with its
// weights; a click fills the edits (the best on the held-out prompts first), and the generation streams in token by token
// (POST /steer/stream, server-sent events read from a fetch stream), the clean and the steered
// continuation side by side. Uses app.js's helpers (api, authHeaders, el, fmt, enc, featLink,
// saes, table, interventionsOff, needs); only `steeringView` is global. Before any click the page
// says what it lacks (the --allow-interventions flag, a steering table) with the command that adds it.
(function () {
"use strict";

// The events of a text/event-stream body as they arrive: onEvent(name, data) for each.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) onEvent(name, JSON.parse(data.join("\n")));
    }
  }
}

// POST `body` to /steer/stream; onEvent for each event (an error answer throws before any).
async function streamSteer(body, onEvent) {
  const response = await fetch("/steer/stream", {
    method: "POST", body: JSON.stringify(body),
    headers: { "Content-Type": "application/json", Accept: "text/event-stream", ...authHeaders() },
  });
  if (!response.ok) {
    const data = await response.json().catch(() => ({ detail: response.statusText }));
    throw new Error(data.detail || response.statusText);
  }
  await readEvents(response, onEvent);
}

const strength = (s) => `${fmt(s.alpha)} (` +
  (s.act_multiple === null ? "" : `${fmt(s.act_multiple)}× typical, `) + `${fmt(s.norm_fraction)} of |resid|)`;

const pct = (x) => (x === null || x === undefined ? "–" : `${Math.round(100 * x)}%`);

// One held-out measurement (Confirmed): the ratio with its 95% interval and the share of
// (target, prompt) pairs reaching the requested ratio under the KL bound.
const heldOut = (c) => `×${fmt(c.ratio)} [${fmt(c.ratio_low)}–${fmt(c.ratio_high)}], ${pct(c.share_reached)} of ${c.n_prompts}`;

// The share of pairs reached per prompt style, e.g. "neutral 75% (8) · question 50% (2)".
const perStyle = (styles) => el("span", { class: "steer-styles" },
  Object.entries(styles || {}).map(([style, c]) => `${style} ${pct(c.share_reached)} (${c.n_prompts})`).join(" · "));

const densityText = (density, kind) => fmt(density) + (kind === "direction" ? " (direction)" : "");

function rankedTable(result, choose) {
  return table(["rank", "feature", "label", "ratio", "held-out", "per style", "density", "siblings", "target rank",
    "kl_rest", "strength", "reached", ""], result.features, {
    feature: (r) => featLink(r.sae_id, r.latent),
    ratio: (r) => el("b", {}, `×${fmt(r.ratio)}`),
    "held-out": (r) => heldOut(r.confirmed),
    "per style": (r) => perStyle(r.confirmed_styles),
    density: (r) => densityText(r.density, r.kind),
    siblings: (r) => (r.sibling_ratio === null ? "–" : `×${fmt(r.sibling_ratio)}`),
    "target rank": (r) => fmt(r.target_rank),
    strength: (r) => strength(r.strength),
    reached: (r) => (r.reached ? "yes" : "no"),
    "": (r) => el("button", { class: "steer-use", onclick: () => choose(r) }, "steer"),
  });
}

// The fitted sparse combination in the SAE basis: each feature with its weight, label and
// density, what it does on the held-out prompts, and a button that fills all its edits.
function combinationCard(result, chooseCombination) {
  const c = result.combination;
  if (!c) return "";
  const rows = c.latents.map((latent, i) => ({ latent, label: c.labels[i], weight: c.weights[i], density: c.densities[i] }));
  return el("div", { class: "card", id: "steering-combination" },
    el("h3", {}, `Fitted combination of ${c.latents.length} features` + (result.best === "combination" ? " (best on the held-out prompts)" : "")),
    table(["feature", "label", "weight", "density"], rows, {
      feature: (r) => featLink(c.sae_id, r.latent),
      weight: (r) => `${fmt(r.weight)} of |resid|`,
    }),
    el("p", {}, `held-out ${heldOut(c.confirmed)}; `, perStyle(c.confirmed_styles),
      `; siblings ${c.sibling_ratio === null ? "–" : `×${fmt(c.sibling_ratio)}`}, target rank ${fmt(c.target_rank)}, ` +
      `kl_rest ${fmt(c.kl_rest)} at ${fmt(c.norm_fraction)} of |resid| `,
      el("button", { id: "steering-use-combination", onclick: chooseCombination }, "steer with all")));
}

function sideBySide() {
  const cell = (id) => el("td", { id, class: "steer-text" });
  const baseline = cell("steer-stream-baseline");
  const edited = cell("steer-stream-edited");
  return { baseline, edited, node: el("table", { id: "steer-stream" },
    el("tr", {}, el("th", {}, "clean"), el("th", {}, "steered")), el("tr", {}, baseline, edited)) };
}

async function steeringView() {
  const title = el("h2", {}, "Steer toward a token");
  const off = await interventionsOff("Steering");
  if (off) { view.replaceChildren(title, off); return; }
  const all = await saes();
  const list = all.filter((s) => s.steering_table && s.status === "ok");  // what a search can rank from
  const command = "sae-atlas steering-scores <atlas> --prompts 1 --prompt-tokens 8";
  if (!list.length) {
    view.replaceChildren(title, needs("needs-steering", "No SAE of this atlas has a steering table yet. Screen them with", command));
    return;
  }
  const missing = all.filter((s) => !list.includes(s));
  const target = el("input", { id: "steering-target", type: "text", value: sessionStorage.getItem("sae-atlas-steering-target") || " Friday" });
  const select = el("select", { id: "steering-sae" }, missing.length ? "" : el("option", { value: "" }, "all SAEs"),
    list.map((s) => el("option", { value: s.sae_id }, s.sae_id)));
  const mode = el("select", { id: "steering-mode" }, el("option", { value: "add" }, "add"), el("option", { value: "clamp" }, "clamp"));
  const ranked = el("div", { id: "steering-results" });
  const prompt = el("input", { id: "steering-prompt", type: "text", size: 50, value: "My favourite day of the week is" });
  const edit = el("textarea", { id: "steering-edit", rows: 3, cols: 70 });
  const tokens = el("input", { id: "steering-tokens", type: "number", min: 1, max: 64, value: 16 });
  const out = el("div", { id: "steering-generation" });

  const choose = (row) => {
    edit.value = JSON.stringify([row.edit]);
    out.replaceChildren(el("span", { class: "muted" }, `${row.sae_id} / ${row.latent}${row.label ? ` (${row.label})` : ""}: measured ×${fmt(row.ratio)} ` +
      `at strength ${strength(row.strength)}; press Generate`));
  };
  const chooseCombination = (c) => {
    edit.value = JSON.stringify(c.edits);
    out.replaceChildren(el("span", { class: "muted" }, `${c.sae_id} / ${c.latents.join(" + ")}: held-out ${heldOut(c.confirmed)}; press Generate`));
  };
  const search = async () => {
    sessionStorage.setItem("sae-atlas-steering-target", target.value);
    ranked.replaceChildren(el("span", { class: "muted" }, "measuring..."));
    try {
      const query = `token=${enc(target.value)}&mode=${mode.value}` + (select.value ? `&saes=${enc(select.value)}` : "");
      const result = await api(`/steering/search?${query}`);
      const counts = Object.entries(result.prompt_counts.confirm || {}).map(([style, n]) => `${n} ${style}`).join(", ");
      ranked.replaceChildren(el("p", {}, `Features that raise ${result.target} (ratio: mean p steered / clean on the ranking ` +
        `prompts at the calibrated strength, requested ×${fmt(result.ratio_requested)}, KL on the other tokens under ${fmt(result.kl_bound)}; ` +
        `held-out: the same edit on ${counts} confirmation prompts, with its 95% interval and the share of prompts reaching the ratio)`),
        el("p", { id: "steering-context", class: "muted" }, (result.category ? `class ${result.category}, siblings ${result.siblings.join(",")}; ` : "") +
          `${result.left_out_dead} latents below the density floor ${fmt(result.density_floor)} left out; best on the held-out prompts: ` +
          (result.best === "combination" ? "the fitted combination" : "the top feature")),
        rankedTable(result, choose), combinationCard(result, () => chooseCombination(result.combination)));
      if (result.best === "combination" && result.combination) chooseCombination(result.combination);
      else if (result.features.length) choose(result.features[0]);
    } catch (err) {
      ranked.replaceChildren(el("div", { class: "error" }, err.message));
    }
  };
  const generate = async () => {
    const sides = sideBySide();
    const summary = el("p", { id: "steering-summary", class: "muted" }, "generating...");
    out.replaceChildren(sides.node, summary);
    try {
      const parsed = JSON.parse(edit.value);
      const edits = Array.isArray(parsed) ? parsed : [parsed];
      await streamSteer({ text: prompt.value, edits, saes: [...new Set(edits.map((e) => e.sae).filter(Boolean))], max_new_tokens: Number(tokens.value) }, (name, data) => {
        if (name === "token") {
          if (data.baseline) sides.baseline.append(data.baseline.text);
          if (data.edited) sides.edited.append(data.edited.text);
          summary.textContent = `${data.step + 1} tokens...`;
        } else if (name === "done") {
          summary.textContent = `done: KL(clean || steered) of the first next token ${fmt(data.kl)}`;
          summary.id = "steering-done";
        } else if (name === "error") {
          throw new Error(data.detail);
        }
      });
    } catch (err) {
      out.append(el("div", { class: "error" }, err.message));
    }
  };
  view.replaceChildren(title,
    missing.length ? needs("needs-steering", `Left out, no steering table: ${missing.map((s) => s.sae_id).join(", ")}. Add them with`,
      `${command} ${missing.map((s) => "--sae " + s.sae_id).join(" ")}`) : "",
    el("div", {}, "target token ", target, " ", select, " ", mode, " ", el("button", { id: "steering-run", onclick: search }, "Rank features")),
    ranked,
    el("div", { class: "card", id: "steering-box" }, el("h3", {}, "Generate with the edit"),
      el("div", {}, "prompt ", prompt), el("div", {}, edit),
      el("div", {}, "new tokens ", tokens, " ", el("button", { id: "steering-generate", onclick: generate }, "Generate")), out));
}

window.steeringView = steeringView;
})();
