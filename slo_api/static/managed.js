// Fields a GitOps tool manages (`managed` in the route's body): shown as that tool's, and a
// save that would change one is not sent unless the user asks to force it, warned that the tool
// will put its own value back at its next sync.

import { h } from "./dom.js";

// The managers of the fields a body would change, as {field: manager} (API field names).
export function managedChanges(body, kind, managed) {
  const out = {};
  if (!managed) return out;
  const keys = kind === "pool" ? Object.keys(body.pool || {}).map((k) => "pool." + k) : Object.keys(body);
  for (const key of keys) {
    const field = key === "highPriority" ? "priority" : key;
    if (managed[field]) out[field] = managed[field];
  }
  return out;
}

// {field: manager} from a 409 field_managed's causes.
export function fromCauses(error) {
  const out = {};
  for (const cause of (error && error.causes) || []) {
    if (cause && cause.field && cause.manager) out[cause.field] = cause.manager;
  }
  return out;
}

function byManager(fields) {
  const managers = {};
  for (const [field, manager] of Object.entries(fields)) (managers[manager] ||= []).push(field);
  return Object.entries(managers).map(([manager, names]) => manager + " (" + names.join(", ") + ")");
}

export function refusal(fields) {
  return "managed by " + byManager(fields).join(", ") + ", which would put its own value back " +
    "at its next sync. Change it in the source the tool syncs from (Git, the chart's values).";
}

export function forceWarning(verb, route, fields) {
  return verb + " " + route + " anyway?\n\n" + Object.keys(fields).join(", ") + " " +
    (Object.keys(fields).length === 1 ? "is" : "are") + " managed by " +
    [...new Set(Object.values(fields))].join(", ") + ". The change is written now, but the tool " +
    "will revert it at its next sync (at once with self-heal) unless the same change is made in " +
    "its source.";
}

// A notice above the form and a note on each managed field.
export function markManaged(form, managed) {
  const fields = Object.keys(managed || {});
  if (!fields.length) return;
  form.prepend(h("div", { class: "managed-notice", id: "managed-notice", role: "note" },
    h("strong", { text: "Managed by GitOps: " }),
    byManager(managed).join(", ") + ". Changes to these fields belong in the source the tool " +
    "syncs from; saved here they are refused, unless forced (and then reverted at its next sync)."));
  for (const field of fields) {
    const el = form.querySelector('[data-field="' + CSS.escape(field) + '"]');
    if (!el) continue;
    const box = el.tagName === "FIELDSET" ? el : el.closest(".field") || el;
    box.classList.add("managed");
    box.dataset.managedBy = managed[field];
    box.append(h("p", { class: "managed-note", "data-managed-note": field,
                        text: "Managed by " + managed[field] }));
  }
}
