// The open route's history (GET routes/NAME/history): who changed it, when, from what, and a
// restore of an entry's body, confirmed first and conditional on the version the form loaded.

import { state } from "./state.js";
import { $, h } from "./dom.js";
import { api } from "./api.js";
import { setStatus, describe, handleCommon } from "./status.js";

const SHOWN = 20;

// A value too large to keep (over 8 KiB) is kept as its digest and size.
function isDigest(v) {
  return v !== null && typeof v === "object" && typeof v.digest === "string" &&
    v.digest.startsWith("sha256:") && Object.keys(v).length === 2 && "size" in v;
}

// The fields of an entry's `after` kept only as a digest: such an entry cannot be restored.
export function digested(after) {
  const out = Object.keys(after).filter((k) => k !== "pool" && isDigest(after[k]));
  for (const [k, v] of Object.entries(after.pool || {})) if (isDigest(v)) out.push("pool." + k);
  return out;
}

function value(v) {
  if (v === null || v === undefined) return "(unset)";
  if (isDigest(v)) return "(" + v.size + " bytes, not kept)";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function changeText(change) {
  return change.field + ": " + value(change.from) + " → " + value(change.to);
}

// The PUT that brings the route back to `after`: its fields, and null for each field set now
// that was not set then (what a GET shows but a client does not own is left out).
export function restoreBody(after, current) {
  const body = JSON.parse(JSON.stringify(after));
  body.route = current.route;
  const readOnly = new Set(["route", "kind", "status", "highPriority", "pool"]);
  for (const key of Object.keys(current)) {
    if (!readOnly.has(key) && !(key in body)) body[key] = null;
  }
  if (current.kind === "pool") {
    body.pool = body.pool || {};
    for (const key of Object.keys(current.pool || {})) {
      if (key !== "members" && key !== "gpu" && !(key in body.pool)) body.pool[key] = null;
    }
  }
  return body;
}

// `actions.reload(route)` loads the route into the form again; `actions.writing(work)` runs a
// write of the open route so the change it causes is not taken for someone else's.
export async function showHistory(route, actions) {
  const box = $("history-body");
  if (!box) return;
  const result = await api("GET", "routes/" + encodeURIComponent(route) + "/history?pageSize=" + SHOWN);
  if (route !== state.selected) return;
  if (!result.ok) {
    box.replaceChildren(h("p", { class: "hint", text: "History unavailable: " + describe(result.error) }));
    return;
  }
  const items = result.data.items || [];
  if (!items.length) {
    box.replaceChildren(h("p", { class: "hint", text: "No recorded changes." }));
    return;
  }
  const rows = items.map((entry) => h("li", { class: "history-entry", "data-id": entry.id },
    h("div", { class: "history-head" },
      h("span", { class: "history-time", text: entry.time }),
      h("span", { class: "history-actor", text: entry.actor + (entry.via === "slo-api" ? " via slo-api" : "") }),
      // Carried over from an earlier version's ConfigMap: a store namespace editors could write.
      entry.migrated === true
        ? h("span", { class: "hint history-migrated", text: "migrated",
                      title: "Carried over from the ConfigMap an earlier version kept this history in, which the namespace's editors could write" })
        : null,
      digested(entry.after || {}).length
        ? h("span", { class: "hint", text: "Too large to restore (" + digested(entry.after).join(", ") + ")" })
        : h("button", { type: "button", class: "secondary history-restore", text: "Restore",
                        "aria-label": "Restore " + route + " as of " + entry.time,
                        onclick: () => actions.writing(() => restore(route, entry, actions.reload)) })),
    h("ul", { class: "history-changes" },
      (entry.changes || []).map((c) => h("li", { text: changeText(c) })))));
  const more = result.data.total > items.length
    ? h("p", { class: "hint", text: "Showing the latest " + items.length + " of " + result.data.total + "." })
    : null;
  // replaceChildren writes a null as the text "null": only the parts there are.
  box.replaceChildren(...[h("ol", { class: "history-list" }, rows), more].filter(Boolean));
}

async function restore(route, entry, reload) {
  if (!state.original || state.original.route !== route) return;
  if (!confirm("Restore " + route + " to how it was after the change of " + entry.time +
               " by " + entry.actor + "?")) return;
  const headers = state.etag ? { "If-Match": state.etag } : {};
  const body = restoreBody(entry.after, state.original);
  const result = await api("PUT", "routes/" + encodeURIComponent(route), { body, headers });
  if (result.ok) {
    await reload(route);
    setStatus("Restored " + route + " as of " + entry.time + ".", "success");
    return;
  }
  if (result.status === 412) {
    setStatus("Not restored: " + route + " was changed elsewhere since you loaded it. Reload and try again.", "error");
    return;
  }
  if (!handleCommon(result)) setStatus("Not restored: " + describe(result.error), "error");
}
