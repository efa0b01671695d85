// Steer page (#/steering): "steer toward" a target token. The SAEs' features ranked by their
// measured effect on the token (GET /steering/search: probability ratio and KL at a calibrated
// strength), a click on one fills a steer edit, and the generation streams in token by token
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

function rankedTable(result, choose) {
  return table(["rank", "feature", "label", "ratio", "p_clean", "p_steered", "kl_rest", "strength", "reached", ""],
    result.features, {
      feature: (r) => featLink(r.sae_id, r.latent),
      ratio: (r) => el("b", {}, `×${fmt(r.ratio)}`),
      strength: (r) => strength(r.strength),
      reached: (r) => (r.reached ? "yes" : "no"),
      "": (r) => el("button", { class: "steer-use", onclick: () => choose(r) }, "steer"),
    });
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
  const command = "sae-atlas steering-scores --atlas <atlas> --prompts 1 --prompt-tokens 8";
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
    edit.value = JSON.stringify(row.edit);
    out.replaceChildren(el("span", { class: "muted" }, `${row.sae_id} / ${row.latent}${row.label ? ` (${row.label})` : ""}: measured ×${fmt(row.ratio)} ` +
      `at strength ${strength(row.strength)}; press Generate`));
  };
  const search = async () => {
    sessionStorage.setItem("sae-atlas-steering-target", target.value);
    ranked.replaceChildren(el("span", { class: "muted" }, "measuring..."));
    try {
      const query = `token=${enc(target.value)}&mode=${mode.value}` + (select.value ? `&sae_id=${enc(select.value)}` : "");
      const result = await api(`/steering/search?${query}`);
      ranked.replaceChildren(el("p", {}, `Features that raise ${result.target} (ratio: mean p steered / clean on held-out ` +
        `prompts at the calibrated strength, requested ×${fmt(result.ratio_requested)}, KL on the other tokens under ${fmt(result.kl_bound)})`),
        rankedTable(result, choose));
      if (result.features.length) choose(result.features[0]);
    } catch (err) {
      ranked.replaceChildren(el("div", { class: "error" }, err.message));
    }
  };
  const generate = async () => {
    const sides = sideBySide();
    const summary = el("p", { id: "steering-summary", class: "muted" }, "generating...");
    out.replaceChildren(sides.node, summary);
    try {
      const edits = [JSON.parse(edit.value)];
      await streamSteer({ text: prompt.value, edits, max_new_tokens: Number(tokens.value) }, (name, data) => {
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
