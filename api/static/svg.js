// `svg(tag, attrs, ...children)`: an SVG element, as app.js's `el` makes HTML ones (the Board,
// Graph, Compare and Depth pages draw with it). The namespace is a name, nothing is loaded from
// it. `linear` and `axes`: the scales and labelled axes of the Compare and Depth plots.
"use strict";

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A linear scale from [lo, hi] to [from, to]; ticks at the given step (default: both ends and the middle).
function linear(lo, hi, from, to, step) {
  const span = hi - lo || 1;
  const f = (x) => from + ((x - lo) / span) * (to - from);
  f.ticks = step ? Array.from({ length: Math.floor(span / step + 1e-9) + 1 }, (_, i) => lo + i * step) : [lo, (lo + hi) / 2, hi];
  return f;
}

// Axes with ticks and labels inside a plot of W x H with the given margins.
function axes(plot, sx, sy, box, xLabel, yLabel) {
  const { W, H, left, bottom, top, right } = box;
  plot.append(svg("line", { x1: left, y1: H - bottom, x2: W - right, y2: H - bottom, class: "axis" }),
    svg("line", { x1: left, y1: top, x2: left, y2: H - bottom, class: "axis" }),
    svg("text", { x: (left + W - right) / 2, y: H - 4, class: "label", "text-anchor": "middle" }, xLabel),
    svg("text", { x: 10, y: (top + H - bottom) / 2, class: "label", "text-anchor": "middle",
      transform: `rotate(-90 10 ${(top + H - bottom) / 2})` }, yLabel));
  for (const t of sx.ticks) plot.append(svg("text", { x: sx(t), y: H - bottom + 13, class: "tick", "text-anchor": "middle" }, fmt(t)));
  for (const t of sy.ticks) plot.append(svg("text", { x: left - 4, y: sy(t) + 4, class: "tick", "text-anchor": "end" }, (sy.label || fmt)(t)));
}
