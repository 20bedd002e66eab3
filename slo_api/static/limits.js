// The route's limits (`limits` in its body: the caps a platform admin set in the namespace's
// SLOLimits `default`) bound the inputs they cap, each with the reason beside it. A value stored
// beyond its cap (`overLimits`) stays within the input's bounds: the API server lets it stay or
// move toward the cap, never away (so the bound is the stored value, not the cap).

import { h } from "./dom.js";

const SOURCE = "this namespace's SLOLimits, set by a platform admin";

function thresholds(section) {
  if (!section) return [];
  const sets = [section.default || {}, ...(section.ranges || [])];
  return sets.flatMap((s) => (s.metrics || []).map((m) => Number(m.threshold)))
    .filter((v) => Number.isFinite(v));
}

// Each capped input: [selector, attribute, cap name, the stored extreme, what the cap says].
function bounds(limits, original, maxType) {
  const out = [];
  const cap = (name) => (limits[name] === undefined ? null : limits[name]);
  const upTo = (c, stored) => (stored !== null && stored > c ? stored : c);
  const downTo = (c, stored) => (stored !== null && stored < c ? stored : c);
  if (cap("maxPriority") !== null) {
    out.push(['[data-field="priority"]', "max", "maxPriority",
              upTo(cap("maxPriority"), original.priority ?? 0), "At most " + cap("maxPriority")]);
  }
  const storedMax = original.maximumDeployment;
  for (const [name, type] of [["maxReplicas", "replica"], ["maxPDEngines", "pdengine"]]) {
    if (cap(name) === null || maxType !== type) continue;
    const stored = storedMax && storedMax.type === type ? storedMax.value : null;
    out.push(['[data-field="maximumDeployment.value"]', "max", name, upTo(cap(name), stored),
              "At most " + cap(name) + " " + type + (cap(name) === 1 ? "" : "s")]);
  }
  if (cap("minTTFTSeconds") !== null) {
    const stored = thresholds(original.ttft);
    out.push(['[data-field^="ttft."][data-field$=".threshold"]', "min", "minTTFTSeconds",
              downTo(cap("minTTFTSeconds"), stored.length ? Math.min(...stored) : null),
              "Each TTFT threshold at least " + cap("minTTFTSeconds") + " s"]);
  }
  if (cap("maxOTPS") !== null) {
    const stored = thresholds(original.otps);
    out.push(['[data-field^="otps."][data-field$=".threshold"]', "max", "maxOTPS",
              upTo(cap("maxOTPS"), stored.length ? Math.max(...stored) : null),
              "Each OTPS threshold at most " + cap("maxOTPS")]);
  }
  // A floor: a lower depth demands more replicas (0, unconfigured, is not capped).
  if (cap("minQueueDepth") !== null) {
    const stored = original.queue && original.queue.maxDepth ? original.queue.maxDepth : null;
    out.push(['[data-field="queue.maxDepth"]', "min", "minQueueDepth",
              downTo(cap("minQueueDepth"), stored),
              "At least " + cap("minQueueDepth") + " (or 0, unconfigured)"]);
  }
  return out;
}

function describe(el, note) {
  const ids = (el.getAttribute("aria-describedby") || "").split(" ").filter(Boolean);
  if (!ids.includes(note.id)) el.setAttribute("aria-describedby", [...ids, note.id].join(" "));
}

function apply(form, limits, original, maxType) {
  for (const old of form.querySelectorAll("[data-limit-note]")) old.remove();
  for (const el of form.querySelectorAll("[data-limit]")) {
    el.removeAttribute(el.dataset.limitAttr);
    delete el.dataset.limit;
  }
  for (const [selector, attr, name, value, rule] of bounds(limits, original, maxType)) {
    const inputs = [...form.querySelectorAll(selector)].filter((el) => el.tagName === "INPUT");
    if (!inputs.length) continue;
    const over = value !== limits[name];
    const text = rule + ": " + name + " in " + SOURCE + "." +
      (over ? " The stored value is beyond it: it may stay or move toward it." : "");
    const note = h("p", { class: "limit-note", id: "limit-" + name, "data-limit-note": name, text });
    for (const el of inputs) {
      el.setAttribute(attr, String(value));
      el.dataset.limit = name;
      el.dataset.limitAttr = attr;
      describe(el, note);
    }
    // Beside the one input, or once for a section's thresholds.
    const holder = inputs.length === 1 ? inputs[0].closest(".field") || inputs[0].parentElement
      : inputs[0].closest("fieldset.group[data-field]") || form;
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
      " (each may stay or move toward its limit, not away)." : "")));
  const maxType = () => (draft.maximumDeployment ? draft.maximumDeployment.type : null);
  apply(form, limits, original, maxType());
  // The maximum's cap follows its type.
  const type = form.querySelector('[data-field="maximumDeployment.type"]');
  if (type) type.addEventListener("change", () => apply(form, limits, original, maxType()));
}
