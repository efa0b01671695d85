// `svg(tag, attrs, ...children)`: an SVG element, as app.js's `el` makes HTML ones (the Board,
// Graph and Compare pages draw with it). The namespace is a name, nothing is loaded from it.
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
