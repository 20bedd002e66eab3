// The route model: every route's summary, sorted by name, as `GET config` pages and the change
// stream deliver them. Who shows it listens to "routes".

import { PAGE_SIZE, state, emit } from "./state.js";
import { api } from "./api.js";
import { summaryFields } from "./schema.js";

// Every summary, page by page until `total` are read: { ok: true, items }, or the failed
// answer of the page that could not be read.
export async function fetchSummaries() {
  return fetchPages("config?");
}

// Every route's attainment in the server's budget order (least left first, none last):
// { ok: true, items } as fetchSummaries.
export async function fetchByBudget() {
  return fetchPages("config?view=attainment&sort=budget&");
}

// A route's lowest budget left and its worst status, from an attainment item: as the server
// ranks it, a no_data objective's budget (below the traffic floor) is not the route's.
const SEVERITY = { violated: 3, at_risk: 2, met: 1, no_data: 0 };
export function budgetOf(item) {
  let budget = null;
  let status = null;
  for (const obj of item.objectives || []) {
    if (obj.status !== "no_data" && typeof obj.budgetRemaining === "number" && (budget === null || obj.budgetRemaining < budget)) {
      budget = obj.budgetRemaining;
    }
    if (obj.status && (status === null || (SEVERITY[obj.status] || 0) > (SEVERITY[status] || 0))) {
      status = obj.status;
    }
  }
  return { budget, status };
}

async function fetchPages(query) {
  const items = [];
  for (let page = 1; page <= 1000; page++) {
    const result = await api("GET", query + "page=" + page + "&pageSize=" + PAGE_SIZE);
    if (!result.ok) return result;
    const body = result.data || {};
    const got = Array.isArray(body.items) ? body.items : [];
    items.push(...got);
    if (got.length === 0 || items.length >= (body.total || 0)) break;
  }
  return { ok: true, items };
}

// Sets the list without announcing it: a caller that batches changes announces them itself.
export function setRoutes(items) {
  state.routes = items;
}

export function routesChanged() {
  emit("routes");
}

export function replaceRoutes(items) {
  setRoutes(items);
  routesChanged();
}

// After a write: the list as it is now, or as it was when the service cannot say.
export async function refreshRoutes() {
  const result = await fetchSummaries();
  if (result.ok) replaceRoutes(result.items);
}

// A full /config item (what the change stream carries) as the summary item the list shows,
// picked as the server picks it (the schema's summary fields; unset ones left out). An
// ambiguous item, or one of a kind the schema does not name, is shown as it came.
export function summaryOf(item) {
  if (!item || item.ambiguous) return item;
  const fields = summaryFields(item.kind);
  if (!fields) return item;
  const summary = { route: item.route, kind: item.kind };
  for (const [name, path] of Object.entries(fields)) {
    const value = path.split(".").reduce((v, step) => (v && typeof v === "object" ? v[step] : undefined), item);
    if (value !== undefined && value !== null) summary[name] = value;
  }
  return summary;
}

// One change-stream event (full view) applied in place; not announced (see setRoutes).
export function applyChange(event) {
  const routes = state.routes;
  const at = lowerBound(routes, event.route);
  const present = at < routes.length && routes[at].route === event.route;
  if (event.type === "DELETED") {
    if (present) routes.splice(at, 1);
  } else if (present) {
    routes[at] = summaryOf(event.object);
  } else {
    routes.splice(at, 0, summaryOf(event.object));
  }
}

export function byRoute(items) {
  return items.sort((a, b) => (a.route < b.route ? -1 : a.route > b.route ? 1 : 0));
}

function lowerBound(routes, route) {
  let lo = 0;
  let hi = routes.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (routes[mid].route < route) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
