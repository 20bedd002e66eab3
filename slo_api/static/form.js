// The editor form for each kind of route, drawn from state.draft. Its buttons announce what
// they ask for: "save", "reset", "reload" (the route) and "open" (another route).

import { SECTION_TITLES, KIND_LABELS, state, emit } from "./state.js";
import { $, h, idFor, errorSlot } from "./dom.js";
import { markManaged } from "./managed.js";
import { markLimits } from "./limits.js";
import { boundTypes, metricTypes, swapPolicies } from "./schema.js";

export function control(tag, path, attrs, ...children) {
  const id = idFor(path);
  return h(tag, { id, name: path, "data-field": path, "data-error-slot": id + "-err", ...attrs }, ...children);
}

export function fieldRow(labelText, controlEl, hint) {
  const hintEl = hint ? h("p", { class: "hint", id: controlEl.id + "-hint", text: hint }) : null;
  if (hintEl) {
    controlEl.setAttribute("aria-describedby", hintEl.id);
    controlEl.dataset.describedby = hintEl.id;
  }
  return h("div", { class: "field" },
    h("label", { for: controlEl.id, text: labelText }), controlEl, hintEl, errorSlot(controlEl.id));
}

export function group(path, legend, ...children) {
  const id = idFor(path) + "-group";
  return h("fieldset", { class: "group", "data-field": path, "data-error-slot": id + "-err", id },
    h("legend", { text: legend }), errorSlot(id), ...children);
}

export function bind(el, obj, key, after) {
  el.addEventListener(el.tagName === "SELECT" ? "change" : "input", () => {
    obj[key] = el.value;
    if (after) after(el.value);
  });
  return el;
}

export function options(values, selected, labels) {
  return values.map((v) => h("option", { value: v, selected: v === selected ? true : null,
                                        text: labels && labels[v] !== undefined ? labels[v] : v }));
}

export function rerender(focusId) {
  const scroll = window.scrollY;
  renderEditor();
  window.scrollTo(0, scroll);
  const el = focusId && $(focusId);
  if (el) el.focus();
}

export function renderEditor() {
  const d = state.draft;
  if (!d) return;
  const kind = d.kind;
  const form = h("form", { id: "route-form", class: "route-form", novalidate: true,
                           "aria-labelledby": "editor-heading" });
  form.addEventListener("submit", (event) => { event.preventDefault(); emit("save"); });
  $("editor-heading").replaceChildren(d.route + " ",
    h("span", { class: "badge badge-" + kind, text: KIND_LABELS[kind] || kind }));
  if (kind === "pool") {
    form.append(poolFields(d));
  } else {
    form.append(priorityFields(d), boundsFields(d, kind));
    if (kind === "llm") form.append(sectionFields(d, "ttft"), sectionFields(d, "otps"));
    if (kind === "job") form.append(queueFields(d));
    if (d.pool) form.append(memberPoolInfo(d.pool));
  }
  form.append(h("div", { class: "actions" },
    h("button", { type: "submit", class: "primary", text: "Save" }),
    h("button", { type: "button", class: "secondary", text: "Reload", onclick: () => emit("reload", d.route) }),
    h("button", { type: "button", class: "danger", text: "Reset to defaults…", onclick: () => emit("reset") })));
  markManaged(form, d.managed);
  markLimits(form, d, state.original);
  $("editor-body").replaceChildren(form);
}

export function priorityFields(d) {
  const number = control("input", "priority", { type: "number", min: 0, max: 10, step: 1,
                                                inputmode: "numeric", value: d.priority });
  const toggle = h("input", { type: "checkbox", id: "f-highPriority", "data-field": "highPriority",
                              "data-error-slot": "f-priority-err", checked: d.priority === "10" });
  bind(number, d, "priority", (v) => { toggle.checked = String(v).trim() === "10"; });
  toggle.addEventListener("change", () => {
    if (toggle.checked) d.priority = "10";
    else if (String(d.priority).trim() === "10") d.priority = "0";
    number.value = d.priority;
  });
  return group("priority-group", "Priority",
    h("div", { class: "inline" },
      fieldRow("Priority (0 to 10)", number),
      h("div", { class: "field checkbox" }, toggle, h("label", { for: "f-highPriority", text: "High priority (10)" }))));
}

export function boundsFields(d, kind) {
  const types = boundTypes(kind);
  const boundEditor = (bound, path, typesList) => h("div", { class: "inline" },
    fieldRow("Type", bind(control("select", path + ".type", {}, options(typesList, bound.type)), bound, "type")),
    fieldRow("Value", bind(control("input", path + ".value", { type: "number", min: 0, step: 1,
                                                                 inputmode: "numeric", value: bound.value }), bound, "value")));
  const minGroup = group("minimumDeployment", "Minimum deployment",
    boundEditor(d.minimumDeployment, "minimumDeployment", types.min),
    h("p", { class: "hint", text: "0 lets the service scale to zero." }));
  let maxGroup;
  if (d.maximumDeployment) {
    maxGroup = group("maximumDeployment", "Maximum deployment",
      boundEditor(d.maximumDeployment, "maximumDeployment", types.max),
      h("button", { type: "button", class: "secondary small", id: "max-remove", text: "Remove maximum",
                    onclick: () => { d.maximumDeployment = null; rerender("max-add"); } }));
  } else {
    maxGroup = group("maximumDeployment", "Maximum deployment",
      h("p", { class: "hint", text: "No maximum: the service is opted out of autoscaling." }),
      h("button", { type: "button", class: "secondary small", id: "max-add", text: "Add maximum",
                    onclick: () => {
                      const minValue = Number(d.minimumDeployment.value) || 1;
                      d.maximumDeployment = { type: types.max.includes(d.minimumDeployment.type)
                        ? d.minimumDeployment.type : types.fallback, value: String(Math.max(minValue, 1)) };
                      rerender(idFor("maximumDeployment.value"));
                    } }));
  }
  return h("div", { class: "bounds" }, minGroup, maxGroup);
}

export function metricsTable(metrics, path, caption) {
  const rows = metrics.map((m, i) => {
    const base = path + "." + i;
    const typeSel = bind(control("select", base + ".type", { "aria-label": caption + " " + (i + 1) + " type" },
      options(metricTypes(), m.type)), m, "type");
    const threshold = bind(control("input", base + ".threshold", {
      type: "number", min: 0, step: "any", inputmode: "decimal", value: m.threshold,
      "aria-label": caption + " " + (i + 1) + " threshold" }), m, "threshold");
    return h("tr", {},
      h("td", {}, typeSel, errorSlot(typeSel.id)),
      h("td", {}, threshold, errorSlot(threshold.id)),
      h("td", {}, h("button", {
        type: "button", class: "secondary small", text: "Remove",
        "aria-label": "Remove " + caption.toLowerCase() + " " + (i + 1),
        onclick: () => { metrics.splice(i, 1); rerender(idFor(path) + "-add"); } })));
  });
  const table = h("table", { class: "metrics" },
    h("caption", { class: "visually-hidden", text: caption }),
    h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Type" }), h("th", { scope: "col", text: "Threshold" }),
      h("th", { scope: "col" }, h("span", { class: "visually-hidden", text: "Actions" })))),
    h("tbody", {}, rows));
  const add = h("button", { type: "button", class: "secondary small", id: idFor(path) + "-add",
    text: "Add metric", "aria-label": "Add " + caption.toLowerCase(),
    onclick: () => {
      const used = new Set(metrics.map((m) => m.type));
      metrics.push({ type: metricTypes().find((t) => !used.has(t)) || "p90", threshold: "" });
      rerender(idFor(path + "." + (metrics.length - 1) + ".threshold"));
    } });
  const wrapId = idFor(path) + "-wrap";
  return h("div", { class: "metrics-wrap", "data-field": path, "data-error-slot": wrapId + "-err", id: wrapId },
    metrics.length ? table : h("p", { class: "hint", text: "No metrics: add at least one." }),
    errorSlot(wrapId), add);
}

export function sectionFields(d, name) {
  const title = SECTION_TITLES[name];
  const label = name.toUpperCase();
  const section = d[name];
  if (!section) {
    return group(name, title,
      h("p", { class: "hint", text: "Not set." }),
      h("button", { type: "button", class: "secondary small", id: "f-" + name + "-add", text: "Add " + label + " targets",
        onclick: () => {
          d[name] = { default: { metrics: [{ type: name === "ttft" ? "p90" : "avg", threshold: "" }] }, ranges: [] };
          rerender(idFor(name + ".default.metrics.0.threshold"));
        } }));
  }
  const ranges = section.ranges.map((r, i) => {
    const base = name + ".ranges." + i;
    return group(base, label + " range " + (i + 1),
      h("div", { class: "inline" },
        fieldRow("From context length", bind(control("input", base + ".contextLengthRangeLow", {
          type: "number", min: 0, step: 1, inputmode: "numeric", value: r.contextLengthRangeLow }), r, "contextLengthRangeLow")),
        fieldRow("To context length", bind(control("input", base + ".contextLengthRangeHigh", {
          type: "number", min: 1, step: 1, inputmode: "numeric", value: r.contextLengthRangeHigh }), r, "contextLengthRangeHigh"),
          "Empty: no upper end.")),
      metricsTable(r.metrics, base + ".metrics", label + " range " + (i + 1) + " metric"),
      h("button", { type: "button", class: "secondary small", text: "Remove range " + (i + 1),
        onclick: () => { section.ranges.splice(i, 1); rerender("f-" + name + "-range-add"); } }));
  });
  return group(name, title,
    h("h3", { text: "Default" }),
    metricsTable(section.default.metrics, name + ".default.metrics", label + " default metric"),
    h("h3", { text: "By context length" }),
    ranges.length ? ranges : h("p", { class: "hint", text: "No ranges: the default applies to every request." }),
    h("div", { class: "inline" },
      h("button", { type: "button", class: "secondary small", id: "f-" + name + "-range-add", text: "Add range",
        onclick: () => {
          const last = section.ranges[section.ranges.length - 1];
          section.ranges.push({ contextLengthRangeLow: last ? last.contextLengthRangeHigh || "" : "0",
                                contextLengthRangeHigh: "",
                                metrics: [{ type: section.default.metrics[0] ? section.default.metrics[0].type : "p90", threshold: "" }] });
          rerender(idFor(name + ".ranges." + (section.ranges.length - 1) + ".contextLengthRangeLow"));
        } }),
      h("button", { type: "button", class: "danger small", text: "Remove " + label + " targets",
        onclick: () => { d[name] = null; rerender("f-" + name + "-add"); } })));
}

export function queueFields(d) {
  if (!d.queue) d.queue = { maxDepth: "0", promql: "" };
  return group("queue", "Queue",
    h("div", { class: "inline" },
      fieldRow("Max depth", bind(control("input", "queue.maxDepth", { type: "number", min: 0, step: 1,
        inputmode: "numeric", value: d.queue.maxDepth }), d.queue, "maxDepth"), "Pending jobs per replica; 0 = not configured.")),
    fieldRow("PromQL query", bind(control("input", "queue.promql", { type: "text", class: "mono wide",
      spellcheck: "false", autocomplete: "off", value: d.queue.promql }), d.queue, "promql"), "Returns the queue depth."));
}

export function yesNo(v) {
  return v === true ? "yes" : v === false ? "no" : "–";
}

export function memberPoolInfo(pool) {
  return h("section", { class: "group readonly", "aria-labelledby": "pool-info-h" },
    h("h3", { id: "pool-info-h", text: "Model pool (read-only)" }),
    h("dl", { class: "facts" },
      h("dt", { text: "Pool" }), h("dd", {}, pool.route || "–", " ",
        pool.route ? h("button", { type: "button", class: "link", text: "Open pool",
                                   onclick: () => emit("open", pool.route) }) : null),
      h("dt", { text: "Resident" }), h("dd", { text: yesNo(pool.resident) }),
      h("dt", { text: "Phase" }), h("dd", { text: pool.phase || "–" })));
}

export function poolFields(d) {
  const p = d.pool;
  const members = p.members || [];
  const memberOptions = [h("option", { value: "", text: "(none: the first request picks)", selected: p.default === "" ? true : null })]
    .concat(members.map((m) => h("option", { value: m, text: m, selected: m === p.default ? true : null })));
  if (p.default && !members.includes(p.default)) {
    memberOptions.push(h("option", { value: p.default, text: p.default + " (not a member)", selected: true }));
  }
  const policies = swapPolicies();
  if (p.swapPolicy && !policies.includes(p.swapPolicy)) policies.push(p.swapPolicy);
  const settings = group("pool", "Pool settings",
    fieldRow("Default member", bind(control("select", "pool.default", {}, memberOptions), p, "default"),
      "Warmed on a cold pool."),
    fieldRow("Swap policy", bind(control("select", "pool.swapPolicy", {}, options(policies, p.swapPolicy)), p, "swapPolicy")),
    h("div", { class: "inline" },
      fieldRow("Swap budget", bind(control("input", "pool.swapBudget", { type: "text", class: "mono", spellcheck: "false",
        autocomplete: "off", value: p.swapBudget }), p, "swapBudget"), "A duration, e.g. 90s, 5m, 1h30m."),
      fieldRow("Reclaim after", bind(control("input", "pool.reclaimAfter", { type: "text", class: "mono", spellcheck: "false",
        autocomplete: "off", value: p.reclaimAfter }), p, "reclaimAfter"), "Empty: not set. Used by the reclaim policy.")));
  const st = state.original.status || {};
  const memberRows = (st.members || []).map((m) => h("tr", {},
    h("th", { scope: "row", text: m.name }), h("td", { text: m.phase || "–" }), h("td", { text: yesNo(m.resident) })));
  const status = h("section", { class: "group readonly", "aria-labelledby": "pool-status-h" },
    h("h3", { id: "pool-status-h", text: "Status (read-only)" }),
    h("dl", { class: "facts", id: "pool-status" },
      h("dt", { text: "Members" }), h("dd", { text: members.join(", ") || "–" }),
      h("dt", { text: "GPUs" }), h("dd", { text: p.gpu === undefined || p.gpu === null ? "–" : String(p.gpu) }),
      h("dt", { text: "Phase" }), h("dd", { text: st.phase || "–" }),
      h("dt", { text: "Resident" }), h("dd", { text: st.residentMember || "none" }),
      h("dt", { text: "Pending" }), h("dd", { text: st.pendingMember || "none" })),
    memberRows.length ? h("table", { class: "members" },
      h("caption", { text: "Members as observed" }),
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Member" }), h("th", { scope: "col", text: "Phase" }),
        h("th", { scope: "col", text: "Resident" }))),
      h("tbody", {}, memberRows)) : h("p", { class: "hint", text: "No member status reported." }));
  return h("div", { class: "stack" }, settings, status);
}
