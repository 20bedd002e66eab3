// The PUT body: only the fields that differ from what was loaded.

import { state } from "./state.js";
import { same } from "./dom.js";

export function parseNumber(raw, path, errors, integer) {
  const text = String(raw).trim();
  const value = Number(text);
  if (text === "" || !Number.isFinite(value)) {
    errors.push({ field: path, message: integer ? "Enter a whole number." : "Enter a number." });
    return null;
  }
  return value;
}

export function sectionBody(section, name, errors) {
  if (!section) return null;
  const metrics = (ms, base) => ms.map((m, i) => ({
    type: m.type,
    threshold: parseNumber(m.threshold, base + "." + i + ".threshold", errors, false),
  }));
  const out = { default: { metrics: metrics(section.default.metrics, name + ".default.metrics") } };
  if (section.ranges.length) {
    out.ranges = section.ranges.map((r, i) => {
      const base = name + ".ranges." + i;
      const range = {
        contextLengthRangeLow: parseNumber(r.contextLengthRangeLow, base + ".contextLengthRangeLow", errors, true),
        metrics: metrics(r.metrics, base + ".metrics"),
      };
      if (String(r.contextLengthRangeHigh).trim() !== "") {
        range.contextLengthRangeHigh = parseNumber(r.contextLengthRangeHigh, base + ".contextLengthRangeHigh", errors, true);
      }
      return range;
    });
  }
  return out;
}

// The fields that differ from what was loaded; whole sections for ttft, otps and queue.
export function buildBody(quiet) {
  const d = state.draft;
  const o = state.original;
  const errors = [];
  const body = {};
  if (d.kind === "pool") {
    const pool = {};
    const p = d.pool;
    const orig = o.pool || {};
    const opt = (v) => (String(v).trim() === "" ? null : String(v).trim());
    const fields = { default: opt(p.default), swapPolicy: p.swapPolicy,
                     swapBudget: String(p.swapBudget).trim(), reclaimAfter: opt(p.reclaimAfter) };
    for (const [key, value] of Object.entries(fields)) {
      if (!same(value, orig[key])) pool[key] = value;
    }
    if (Object.keys(pool).length) body.pool = pool;
    return { body, errors };
  }
  const priority = parseNumber(d.priority, "priority", errors, true);
  if (priority === null || priority !== o.priority) body.priority = priority;
  const bound = (b, path) => (b ? { type: b.type, value: parseNumber(b.value, path + ".value", errors, true) } : null);
  const min = bound(d.minimumDeployment, "minimumDeployment");
  const max = bound(d.maximumDeployment, "maximumDeployment");
  if (!same(min, o.minimumDeployment)) body.minimumDeployment = min;
  if (!same(max, o.maximumDeployment)) body.maximumDeployment = max;
  if (d.kind === "llm") {
    for (const name of ["ttft", "otps"]) {
      const section = sectionBody(d[name], name, errors);
      if (!same(section, o[name])) body[name] = section;
    }
  } else if (d.kind === "job" && d.queue) {
    const queue = { maxDepth: parseNumber(d.queue.maxDepth, "queue.maxDepth", errors, true),
                    promql: d.queue.promql };
    if (!same(queue, o.queue)) body.queue = queue;
  }
  if (quiet) return { body: errors.length ? { _invalid: true, ...body } : body, errors };
  return { body, errors };
}
