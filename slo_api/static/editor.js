// The open route: selecting, loading into the form, saving with If-Match, resetting.

import { $, state } from "./state.js";
import { h, clone, same } from "./dom.js";
import { setStatus, api, describe, handleCommon } from "./api.js";
import { markSelected, refreshListQuietly } from "./list.js";
import { buildBody } from "./body.js";
import { clearFieldErrors, showErrors } from "./field-errors.js";
import { renderEditor } from "./form.js";
import { showHistory } from "./history.js";

export function dirty() {
  return state.original && state.draft && Object.keys(buildBody(true).body).length > 0;
}

export async function selectRoute(route, force) {
  if (!force && route !== state.selected && dirty() &&
      !confirm("Discard the unsaved changes to " + state.selected + "?")) {
    return;
  }
  state.selected = route;
  const seq = ++state.seq;
  markSelected();
  history.replaceState(null, "", "#" + encodeURIComponent(route));
  $("editor-heading").textContent = route;
  const result = await api("GET", "routes/" + encodeURIComponent(route));
  if (seq !== state.seq) return;
  if (!result.ok) {
    state.original = state.draft = state.etag = null;
    if (handleCommon(result)) return;
    const what = result.status === 409 ? "This route is claimed by more than one resource"
      : result.status === 404 ? "This route does not exist (any more)" : "Could not load the route";
    showPlaceholder(what + ": " + describe(result.error));
    setStatus(what + ".", "error");
    return;
  }
  loadInto(result);
  setStatus("Loaded " + route + ".", "info");
}

export function loadInto(result) {
  state.original = result.data;
  state.draft = toDraft(result.data);
  state.etag = result.headers.get("ETag");
  renderEditor();
  showHistory(result.data.route, { reload: (route) => selectRoute(route, true), writing });
}

export function showPlaceholder(text) {
  $("editor-body").replaceChildren(h("p", { class: "hint", text }));
  $("history-body").replaceChildren();
}

// Numbers become strings while they are edited, so a half-typed value is kept as typed.
export function toDraft(route) {
  const d = clone(route);
  const str = (v) => (v === undefined || v === null ? "" : String(v));
  if (d.kind === "pool") {
    const p = d.pool || {};
    d.pool = { ...p, default: str(p.default), swapPolicy: p.swapPolicy || "sticky",
               swapBudget: str(p.swapBudget), reclaimAfter: str(p.reclaimAfter) };
    return d;
  }
  d.priority = str(d.priority);
  const bound = (b) => (b ? { type: b.type || "replica", value: str(b.value) } : null);
  d.minimumDeployment = bound(d.minimumDeployment) || { type: "replica", value: "1" };
  d.maximumDeployment = bound(d.maximumDeployment);
  const metrics = (ms) => (ms || []).map((m) => ({ type: m.type, threshold: str(m.threshold) }));
  for (const name of ["ttft", "otps"]) {
    const s = d[name];
    if (!s) { d[name] = null; continue; }
    d[name] = {
      default: { metrics: metrics(s.default && s.default.metrics) },
      ranges: (s.ranges || []).map((r) => ({
        contextLengthRangeLow: str(r.contextLengthRangeLow),
        contextLengthRangeHigh: str(r.contextLengthRangeHigh),
        metrics: metrics(r.metrics),
      })),
    };
  }
  if (d.queue) d.queue = { maxDepth: str(d.queue.maxDepth), promql: str(d.queue.promql) };
  return d;
}

// -- save and reset

// While the page itself writes the open route, the change it causes is held back: once the write
// has answered, it matches what the form loaded and is not mistaken for someone else's.
async function writing(work) {
  state.writing = true;
  try {
    await work();
  } finally {
    state.writing = false;
    const missed = state.missed;
    state.missed = null;
    if (missed && missed.route === state.selected) routeChanged(missed);
  }
}

function reloadButton(route) {
  return h("button", { type: "button", class: "primary", text: "Reload route",
                       onclick: () => selectRoute(route, true) });
}

// The open route changed elsewhere (live.js): a form without edits shows the new values; one
// with unsaved edits keeps them and says so.
export function routeChanged(event) {
  if (state.writing) {
    state.missed = event;
    return;
  }
  const route = event.route;
  if (event.type !== "DELETED" && state.original && same(event.object, state.original)) return;
  const edited = dirty();
  if (event.type === "DELETED") {
    setStatus(route + " was deleted elsewhere.", "error", edited ? [reloadButton(route)] : []);
    if (!edited) {
      state.original = state.draft = state.etag = null;
      showPlaceholder("This route does not exist (any more).");
    }
    return;
  }
  if (edited) {
    setStatus(route + " was changed elsewhere since you loaded it. Your edits are kept, but saving " +
              "them would be refused: reload to see the current values (your edits here will be lost).",
              "error", [reloadButton(route)]);
    return;
  }
  const scroll = window.scrollY;
  selectRoute(route, true).then(() => {
    if (state.selected !== route) return;
    window.scrollTo(0, scroll);
    setStatus(route + " was changed elsewhere; the form shows the current values.", "info");
  });
}

export function save() {
  return writing(saveNow);
}

export function resetRoute() {
  return writing(resetNow);
}

async function saveNow() {
  if (!state.draft) return;
  clearFieldErrors();
  const route = state.draft.route;
  const { body, errors } = buildBody(false);
  if (errors.length) {
    showErrors({ causes: errors });
    setStatus("Not saved: " + errors.length + " field" + (errors.length === 1 ? " needs" : "s need") + " a value.", "error");
    return;
  }
  const changed = Object.keys(body.pool || body);
  if (!changed.length) {
    setStatus("No changes to save.", "info");
    return;
  }
  setStatus("Saving " + route + "…", "info");
  const headers = state.etag ? { "If-Match": state.etag } : {};
  const result = await api("PUT", "routes/" + encodeURIComponent(route), { body, headers });
  if (route !== state.selected) return;
  if (result.ok) {
    const etag = result.headers.get("ETag");
    if (etag) {
      loadInto(result);
    } else {
      const fresh = await api("GET", "routes/" + encodeURIComponent(route));
      loadInto(fresh.ok ? fresh : result);
    }
    setStatus("Saved " + route + " (" + changed.join(", ") + ").", "success");
    refreshListQuietly();
    return;
  }
  if (result.status === 412) {
    setStatus("Not saved: " + route + " was changed elsewhere since you loaded it. " +
              "Reload to see the current values (your edits here will be lost).", "error",
              [h("button", { type: "button", class: "primary", text: "Reload route",
                             onclick: () => selectRoute(route, true) })]);
    return;
  }
  if (handleCommon(result)) return;
  const unplaced = showErrors(result.error);
  const extra = unplaced.length && unplaced.join("; ") !== result.error.message ? " " + unplaced.join("; ") : "";
  setStatus("Not saved: " + describe(result.error) + extra, "error");
}

async function resetNow() {
  const route = state.draft && state.draft.route;
  if (!route) return;
  const what = state.draft.kind === "pool"
    ? "swap policy sticky, swap budget 300s, no default and no reclaim delay"
    : "priority 0, minimum 1 replica, no maximum" + (state.draft.kind === "llm" ? ", no TTFT/OTPS targets" : "");
  if (!confirm("Reset " + route + " to the defaults (" + what + ")?")) return;
  const headers = state.etag ? { "If-Match": state.etag } : {};
  const result = await api("DELETE", "routes/" + encodeURIComponent(route), { headers });
  if (result.ok) {
    await selectRoute(route, true);
    setStatus("Reset " + route + " to the defaults.", "success");
    refreshListQuietly();
    return;
  }
  if (result.status === 412) {
    setStatus("Not reset: " + route + " was changed elsewhere since you loaded it.", "error",
              [h("button", { type: "button", class: "primary", text: "Reload route",
                             onclick: () => selectRoute(route, true) })]);
    return;
  }
  if (!handleCommon(result)) setStatus("Not reset: " + describe(result.error), "error");
}
