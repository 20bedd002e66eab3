// The route's limits (`limits` in its body: the caps a platform admin set in the namespace's
// SLOLimits `default`) bound the inputs they cap, each with the reason beside it, and a save
// beyond one is refused here with that reason. Which bound an input has is the server's rule,
// read, not restated: `overLimitBounds` gives, for each value stored beyond its cap, the bound
// a write of its key (a threshold's range low bound and metric type) may reach; every other
// input, and a new range or metric, is held to the cap itself.

import { h } from "./dom.js";

const SOURCE = "this namespace's SLOLimits, set by a platform admin";

// What each cap bounds, in the form's paths: the input's attribute and the reason it shows.
const CAPS = {
  maxPriority: { attr: "max", rule: (c) => "At most " + c },
  maxReplicas: { attr: "max", type: "replica", rule: (c) => "At most " + c + " replica" + (c === 1 ? "" : "s") },
  maxPDEngines: { attr: "max", type: "pdengine", rule: (c) => "At most " + c + " pdengine" + (c === 1 ? "" : "s") },
  minTTFTSeconds: { attr: "min", section: "ttft", rule: (c) => "Each TTFT threshold at least " + c + " s" },
  maxOTPS: { attr: "max", section: "otps", rule: (c) => "Each OTPS threshold at most " + c },
  // A floor: a lower depth demands more replicas (0, unconfigured, is not capped).
  minQueueDepth: { attr: "min", rule: (c) => "At least " + c + " (or 0, unconfigured)" },
};

function number(raw) {
  const text = String(raw ?? "").trim();
  const value = Number(text);
  return text === "" || !Number.isFinite(value) ? null : value;
}

// The bound the server gives a stored value of this key beyond the cap, or null.
function held(original, limit, low, type) {
  const found = (original.overLimitBounds || []).find((b) => b.limit === limit &&
    (low === undefined || (b.contextLengthRangeLow ?? "default") === low) &&
    (type === undefined || b.type === type));
  return found ? found.bound : null;
}

// The draft's inputs a cap bounds: { field, limit, value, key ({low, type} for a threshold) }.
function capped(draft, limits) {
  const out = [];
  const on = (name) => limits[name] !== undefined && limits[name] !== null;
  if (on("maxPriority")) out.push({ field: "priority", limit: "maxPriority", value: draft.priority, key: {} });
  const max = draft.maximumDeployment;
  for (const name of ["maxReplicas", "maxPDEngines"]) {
    if (on(name) && max && max.type === CAPS[name].type) {
      out.push({ field: "maximumDeployment.value", limit: name, value: max.value, key: {} });
    }
  }
  for (const name of ["minTTFTSeconds", "maxOTPS"]) {
    const section = draft[CAPS[name].section];
    if (!on(name) || !section) continue;
    const base = CAPS[name].section;
    const sets = [[base + ".default", "default", section.default], ...(section.ranges || []).map(
      (r, i) => [base + ".ranges." + i, number(r.contextLengthRangeLow), r])];
    for (const [path, low, set] of sets) {
      ((set && set.metrics) || []).forEach((m, i) => out.push({
        field: path + ".metrics." + i + ".threshold", limit: name, value: m.threshold,
        key: { low: low === null ? NaN : low, type: m.type } }));
    }
  }
  if (on("minQueueDepth") && draft.queue) {
    out.push({ field: "queue.maxDepth", limit: "minQueueDepth", value: draft.queue.maxDepth, key: {} });
  }
  return out;
}

// Each capped input of the draft with its bound and the reason: { field, limit, attr, bound,
// held (the bound is a stored value beyond the cap), value, reason }.
export function inputBounds(draft, original) {
  const limits = (original && original.limits) || {};
  return capped(draft, limits).map((input) => {
    const cap = limits[input.limit];
    const stored = held(original, input.limit, input.key.low, input.key.type);
    const rule = CAPS[input.limit].rule(cap) + ": " + input.limit + " in " + SOURCE + ".";
    const where = input.key.type !== undefined ? " for its range and metric type" : "";
    const reason = stored === null ? rule
      : rule + " The stored " + stored + where + " is beyond it: it may stay or move toward it.";
    return { ...input, attr: CAPS[input.limit].attr, bound: stored === null ? cap : stored,
             held: stored !== null, reason };
  });
}

// The draft's values beyond their bounds, as the causes of a refusal ({ field, message }).
export function limitErrors(draft, original) {
  const errors = [];
  for (const input of inputBounds(draft, original)) {
    const value = number(input.value);
    if (value === null) continue; // no number: the body's own check says so
    if (input.limit === "minQueueDepth" && value === 0) continue;
    const beyond = input.attr === "max" ? value > input.bound : value < input.bound;
    if (!beyond) continue;
    const spread = !input.held && input.key.type !== undefined &&
      (original.overLimitBounds || []).some((b) => b.limit === input.limit)
      ? " A threshold stored beyond it holds only for its own range and metric type." : "";
    errors.push({ field: input.field, limit: input.limit, message: input.reason + spread });
  }
  return errors;
}

function describe(el, note) {
  const ids = (el.getAttribute("aria-describedby") || "").split(" ").filter(Boolean);
  if (!ids.includes(note.id)) el.setAttribute("aria-describedby", [...ids, note.id].join(" "));
}

function apply(form, draft, original) {
  for (const old of form.querySelectorAll("[data-limit-note]")) old.remove();
  for (const el of form.querySelectorAll("[data-limit]")) {
    el.removeAttribute(el.dataset.limitAttr);
    delete el.dataset.limit;
  }
  const byLimit = new Map();
  for (const input of inputBounds(draft, original)) {
    const el = [...form.querySelectorAll('[data-field="' + input.field + '"]')]
      .find((e) => e.tagName === "INPUT");
    if (!el) continue;
    el.setAttribute(input.attr, String(input.bound));
    el.dataset.limit = input.limit;
    el.dataset.limitAttr = input.attr;
    if (!byLimit.has(input.limit)) byLimit.set(input.limit, []);
    byLimit.get(input.limit).push([el, input]);
  }
  for (const [limit, inputs] of byLimit) {
    // One note for a cap: its rule, and each stored value beyond it with the bound it keeps.
    const kept = inputs.filter(([, i]) => i.held).map(([, i]) => i.reason.slice(i.reason.indexOf(" The stored")));
    const text = CAPS[limit].rule(original.limits[limit]) + ": " + limit + " in " + SOURCE + "." +
      [...new Set(kept)].join("") +
      (kept.length && inputs[0][1].key.type !== undefined ? " Other thresholds and new ranges are held to it." : "");
    const note = h("p", { class: "limit-note", id: "limit-" + limit, "data-limit-note": limit, text });
    for (const [el] of inputs) describe(el, note);
    // Beside the one input, or once for a section's thresholds.
    const first = inputs[0][0];
    const section = CAPS[limit].section;
    const holder = section ? form.querySelector('fieldset.group[data-field="' + section + '"]') || form
      : first.closest(".field") || first.parentElement;
    holder.append(note);
  }
}

// A notice above the form, and each capped input bounded with its reason.
export function markLimits(form, draft, original) {
  const limits = original && original.limits;
  if (!limits || !Object.keys(limits).length) return;
  const over = original.overLimits || [];
  form.prepend(h("div", { class: "limits-notice", id: "limits-notice", role: "note" },
    h("strong", { text: "Limits: " }),
    Object.entries(limits).map(([k, v]) => k + " " + v).join(", ") + " (" + SOURCE + ")." +
    (over.length ? " Stored beyond them: " + over.join(", ") +
      " (each may stay or move toward its limit, not away, nor spread to another value)." : "")));
  apply(form, draft, original);
  // An input's bound follows its key: the maximum's type, a threshold's metric type and range.
  form.addEventListener("change", (event) => {
    const field = (event.target && event.target.dataset && event.target.dataset.field) || "";
    if (/(^maximumDeployment\.type|\.type|\.contextLengthRangeLow)$/.test(field)) apply(form, draft, original);
  });
}
