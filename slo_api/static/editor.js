// The open route: selecting, loading into the form, saving with If-Match, resetting. Selecting
// announces "selected" (the route).

import { state, emit } from "./state.js";
import { $, h, clone, same } from "./dom.js";
import { api } from "./api.js";
import { setStatus, describe, handleCommon } from "./status.js";
import { refreshRoutes } from "./routes.js";
import { boundTypes, loadSchema, resetValues } from "./schema.js";
import { buildBody } from "./body.js";
import { clearFieldErrors, showErrors } from "./field-errors.js";
import { renderEditor } from "./form.js";
import { limitErrors } from "./limits.js";
import { showHistory } from "./history.js";
import { showAttainment, clearAttainment } from "./attainment.js";
import { managedChanges, fromCauses, refusal, forceWarning } from "./managed.js";

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
  emit("selected", route);
  history.replaceState(null, "", "#" + encodeURIComponent(route));
  $("editor-heading").textContent = route;
  // The form's choices come from the API's description, read along with the route.
  const [result, schema] = await Promise.all([api("GET", "routes/" + encodeURIComponent(route)), loadSchema()]);
  if (seq !== state.seq) return;
  if (result.ok && !schema.ok) {
    state.original = state.draft = state.etag = null;
    if (handleCommon(schema)) return;
    showPlaceholder("Could not read the API description: " + describe(schema.error));
    setStatus("Could not read the API description.", "error");
    return;
  }
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
  showAttainment(result.data.route);
}

export function showPlaceholder(text) {
  $("editor-body").replaceChildren(h("p", { class: "hint", text }));
  $("history-body").replaceChildren();
  clearAttainment();
}

// Numbers become strings while they are edited, so a half-typed value is kept as typed.
export function toDraft(route) {
  const d = clone(route);
  const str = (v) => (v === undefined || v === null ? "" : String(v));
  // What a field left unset reads as: the value a reset gives it.
  const unset = resetValues(d.kind);
  if (d.kind === "pool") {
    const p = d.pool || {};
    d.pool = { ...p, default: str(p.default), swapPolicy: p.swapPolicy || unset.pool.swapPolicy,
               swapBudget: str(p.swapBudget), reclaimAfter: str(p.reclaimAfter) };
    return d;
  }
  d.priority = str(d.priority);
  const fallback = boundTypes(d.kind).fallback;
  const bound = (b) => (b ? { type: b.type || fallback, value: str(b.value) } : null);
  d.minimumDeployment = bound(d.minimumDeployment) || bound(unset.minimumDeployment);
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

// The open route changed elsewhere (a "change" from the stream): a form without edits shows the new values; one
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
  return writing(() => saveNow(false));
}

export function resetRoute() {
  return writing(() => resetNow(false));
}

// A write refused because a GitOps tool manages fields it changes: say whose they are and
// offer to force it, behind a confirmation that says the tool will revert it.
function offerForce(verb, route, fields, retry) {
  const label = verb + " anyway…";
  setStatus("Not " + (verb === "Save" ? "saved" : "reset") + ": " + Object.keys(fields).join(", ") +
            " " + refusal(fields), "error",
            [h("button", { type: "button", class: "danger", text: label,
                           onclick: () => { if (confirm(forceWarning(verb, route, fields))) writing(retry); } })]);
}

function forcedNote(result) {
  const warning = result.headers.get("Warning");
  return warning ? " Forced: " + warning.replace(/^299 - "|"$/g, "") : "";
}

async function saveNow(force) {
  if (!state.draft) return;
  clearFieldErrors();
  const route = state.draft.route;
  const { body, errors } = buildBody(false);
  if (errors.length) {
    showErrors({ causes: errors });
    setStatus("Not saved: " + errors.length + " field" + (errors.length === 1 ? " needs" : "s need") + " a value.", "error");
    return;
  }
  // Refused here as the API server would, with the reason beside each field.
  const beyond = limitErrors(state.draft, state.original);
  if (beyond.length) {
    showErrors({ causes: beyond });
    setStatus("Not saved: " + [...new Set(beyond.map((e) => e.field))].join(", ") + " beyond " +
              (beyond.length === 1 ? "its limit (" : "their limits (") +
              [...new Set(beyond.map((e) => e.limit))].join(", ") + ").", "error");
    return;
  }
  const changed = Object.keys(body.pool || body);
  if (!changed.length) {
    setStatus("No changes to save.", "info");
    return;
  }
  const managed = managedChanges(body, state.draft.kind, state.original && state.original.managed);
  if (!force && Object.keys(managed).length) {
    offerForce("Save", route, managed, () => saveNow(true));
    return;
  }
  setStatus("Saving " + route + "…", "info");
  const headers = state.etag ? { "If-Match": state.etag } : {};
  const query = force ? "?force=true" : "";
  const result = await api("PUT", "routes/" + encodeURIComponent(route) + query, { body, headers });
  if (route !== state.selected) return;
  if (result.ok) {
    const etag = result.headers.get("ETag");
    if (etag) {
      loadInto(result);
    } else {
      const fresh = await api("GET", "routes/" + encodeURIComponent(route));
      loadInto(fresh.ok ? fresh : result);
    }
    const note = forcedNote(result);
    setStatus("Saved " + route + " (" + changed.join(", ") + ")." + note, note ? "warning" : "success");
    refreshRoutes();
    return;
  }
  if (result.status === 409 && result.error.code === "field_managed") {
    showErrors(result.error);
    offerForce("Save", route, fromCauses(result.error), () => saveNow(true));
    return;
  }
  if (result.status === 412) {
    setStatus("Not saved: " + route + " was changed elsewhere since you loaded it. " +
              "Reload to see the current values (your edits here will be lost).", "error",
              [reloadButton(route)]);
    return;
  }
  if (handleCommon(result)) return;
  const unplaced = showErrors(result.error);
  const said = (result.error.field ? result.error.field + ": " : "") + result.error.message;
  const extra = unplaced.length && unplaced.join("; ") !== said ? " " + unplaced.join("; ") : "";
  setStatus("Not saved: " + describe(result.error) + extra, "error");
}

async function resetNow(force) {
  const route = state.draft && state.draft.route;
  if (!route) return;
  const what = resetText(resetValues(state.draft.kind));
  // A forced reset was confirmed already, with the warning.
  if (!force && !confirm("Reset " + route + " to the defaults (" + what + ")?")) return;
  const headers = state.etag ? { "If-Match": state.etag } : {};
  const query = force ? "?force=true" : "";
  const result = await api("DELETE", "routes/" + encodeURIComponent(route) + query, { headers });
  if (result.ok) {
    await selectRoute(route, true);
    const note = forcedNote(result);
    setStatus("Reset " + route + " to the defaults." + note, note ? "warning" : "success");
    refreshRoutes();
    return;
  }
  if (result.status === 409 && result.error.code === "field_managed") {
    offerForce("Reset", route, fromCauses(result.error), () => resetNow(true));
    return;
  }
  if (result.status === 412) {
    setStatus("Not reset: " + route + " was changed elsewhere since you loaded it.", "error",
              [reloadButton(route)]);
    return;
  }
  if (!handleCommon(result)) setStatus("Not reset: " + describe(result.error), "error");
}

// The values a reset sets, as the confirmation names them.
export function resetText(values) {
  const bound = (b) => b.value + " " + b.type;
  const words = {
    priority: (v) => "priority " + v,
    minimumDeployment: (v) => "minimum " + bound(v),
    maximumDeployment: (v) => (v ? "maximum " + bound(v) : "no maximum"),
    swapPolicy: (v) => "swap policy " + v,
    swapBudget: (v) => "swap budget " + v,
    default: (v) => (v ? "default " + v : "no default"),
    reclaimAfter: (v) => (v ? "reclaim after " + v : "no reclaim delay"),
  };
  const fields = { ...values, ...(values.pool || {}) };
  delete fields.pool;
  const parts = [];
  const sections = ["ttft", "otps"].filter((name) => name in fields && fields[name] === null);
  for (const [field, value] of Object.entries(fields)) {
    if (sections.includes(field)) continue;
    parts.push(words[field] ? words[field](value) : field + " " + (value === null ? "unset" : JSON.stringify(value)));
  }
  if (sections.length) parts.push("no " + sections.map((name) => name.toUpperCase()).join("/") + " targets");
  return parts.join(", ");
}
