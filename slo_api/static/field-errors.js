// API errors shown beside the field they name.

import { state } from "./state.js";
import { $ } from "./dom.js";

// `ttft.default.metrics[0].threshold`, `spec.ttft.default.metrics.0.threshold` and
// `.maximumDeployment.value` all become the dotted path the form's controls carry.
export function normalizeField(field) {
  return String(field || "")
    .replace(/\[(\d+)\]/g, ".$1")
    .replace(/^\.+/, "")
    .replace(/^(body|spec)\./, "")
    .replace(/\.+/g, ".");
}

export function controlFor(field) {
  let path = normalizeField(field);
  if (!path) return null;
  const kind = state.draft && state.draft.kind;
  const candidates = [];
  if (kind === "pool" && !path.startsWith("pool.") && path !== "pool") candidates.push("pool." + path);
  if (path === "highPriority") candidates.push("priority");
  candidates.push(path);
  for (let candidate of candidates) {
    while (candidate) {
      const el = document.querySelector('#editor-body [data-field="' + CSS.escape(candidate) + '"]');
      if (el) return el;
      const cut = candidate.lastIndexOf(".");
      candidate = cut > 0 ? candidate.slice(0, cut) : "";
    }
  }
  return null;
}

export function clearFieldErrors() {
  for (const slot of document.querySelectorAll("#editor-body .field-error")) {
    slot.textContent = "";
    slot.hidden = true;
  }
  for (const el of document.querySelectorAll("#editor-body [aria-invalid]")) {
    el.removeAttribute("aria-invalid");
    if (el.dataset.describedby) el.setAttribute("aria-describedby", el.dataset.describedby);
    else el.removeAttribute("aria-describedby");
  }
}

export function showFieldError(el, message) {
  const slot = $(el.dataset.errorSlot);
  if (!slot) return false;
  slot.textContent = slot.textContent ? slot.textContent + " " + message : message;
  slot.hidden = false;
  if (/^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) {
    el.setAttribute("aria-invalid", "true");
    const ids = new Set((el.getAttribute("aria-describedby") || "").split(/\s+/).filter(Boolean));
    ids.add(slot.id);
    el.setAttribute("aria-describedby", [...ids].join(" "));
  }
  return true;
}

// Shows each cause next to its control; returns the messages no control took.
export function showErrors(error) {
  clearFieldErrors();
  const causes = Array.isArray(error.causes) && error.causes.length ? error.causes
    : [{ field: error.field, message: error.message }];
  const unplaced = [];
  let first = null;
  for (const cause of causes) {
    const el = cause.field ? controlFor(cause.field) : null;
    if (el && showFieldError(el, cause.message || error.message)) {
      if (!first) first = el;
    } else {
      unplaced.push((cause.field ? cause.field + ": " : "") + (cause.message || ""));
    }
  }
  if (first) {
    const target = /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(first.tagName) ? first
      : first.querySelector("input, select, textarea, button") || first;
    target.focus();
  }
  return unplaced;
}
