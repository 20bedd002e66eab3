// DOM and value helpers.

export const $ = (id) => document.getElementById(id);

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "value") el.value = value;
    else if (key === "checked") el.checked = true;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function idFor(path) {
  return "f-" + path.replace(/[^A-Za-z0-9]+/g, "-");
}

export function errorSlot(id) {
  return h("p", { class: "field-error", id: id + "-err", hidden: true });
}

export function clone(value) {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

export function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === "object") {
    const out = {};
    for (const key of Object.keys(value).sort()) {
      const v = value[key];
      if (v === null || v === undefined || (Array.isArray(v) && v.length === 0)) continue;
      out[key] = canonical(v);
    }
    return out;
  }
  return value;
}

export function same(a, b) {
  return JSON.stringify(canonical(a === undefined ? null : a)) ===
    JSON.stringify(canonical(b === undefined ? null : b));
}
