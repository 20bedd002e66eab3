// The route list: loaded page by page, filtered, kept current by live.js.

import { PAGE_SIZE, KIND_LABELS, $, state } from "./state.js";
import { h } from "./dom.js";
import { setStatus, api, describe, handleCommon } from "./api.js";
import { selectRoute } from "./editor.js";

export async function loadRoutes() {
  if (!state.token) {
    setStatus("Enter the API token to load the routes.", "info");
    return;
  }
  setStatus("Loading routes…", "info");
  const items = [];
  for (let page = 1; page <= 1000; page++) {
    const result = await api("GET", "config?page=" + page + "&pageSize=" + PAGE_SIZE);
    if (!result.ok) {
      if (!handleCommon(result)) setStatus("Could not load the routes: " + describe(result.error), "error");
      return;
    }
    const body = result.data || {};
    const got = Array.isArray(body.items) ? body.items : [];
    items.push(...got);
    if (got.length === 0 || items.length >= (body.total || 0)) break;
  }
  state.routes = items;
  renderList();
  setStatus("Loaded " + items.length + " route" + (items.length === 1 ? "" : "s") + ".", "info");
}

// A full /config item (what live.js reads) as the summary item the list shows; summary items
// pass through unchanged.
export function summaryOf(item) {
  if (!item || item.ambiguous) return item;
  if (item.kind === "pool" && item.pool) {
    return { route: item.route, kind: "pool", swapPolicy: item.pool.swapPolicy, swapBudget: item.pool.swapBudget,
             residentMember: (item.status || {}).residentMember || null };
  }
  if (item.kind === "pool") return item;
  return { route: item.route, kind: item.kind, highPriority: item.highPriority, priority: item.priority,
           minimumDeployment: item.minimumDeployment, maximumDeployment: item.maximumDeployment };
}

export function boundText(bound) {
  return bound ? bound.value + " " + (bound.type || "replica") : "none";
}

export function summaryText(item) {
  if (item.ambiguous) {
    return "claimed " + item.count + " times (" + (item.kinds || []).join(", ") + ")";
  }
  if (item.kind === "pool") {
    return (item.swapPolicy || "sticky") + " · budget " + (item.swapBudget || "–") +
      " · resident " + (item.residentMember || "none");
  }
  const max = item.maximumDeployment ? boundText(item.maximumDeployment) : "no max";
  return "priority " + item.priority + " · " + boundText(item.minimumDeployment) + " – " + max;
}

export function renderList() {
  const kind = $("kind-filter").value;
  const needle = $("search").value.trim().toLowerCase();
  const shown = state.routes.filter((item) => {
    if (needle && !String(item.route).toLowerCase().includes(needle)) return false;
    if (!kind) return true;
    if (kind === "ambiguous") return !!item.ambiguous;
    return item.ambiguous ? (item.kinds || []).includes(kind) : item.kind === kind;
  });
  $("route-count").textContent = state.routes.length
    ? "(" + shown.length + (shown.length === state.routes.length ? "" : " of " + state.routes.length) + ")"
    : "";
  const list = $("route-list");
  // A redraw (live.js calls this on every change) keeps the keyboard focus where it was.
  const focused = document.activeElement && list.contains(document.activeElement)
    ? document.activeElement.dataset.route : null;
  list.replaceChildren(...shown.map((item) => {
    const badge = item.ambiguous ? "Conflict" : (KIND_LABELS[item.kind] || item.kind);
    const button = h("button", {
      type: "button", class: "route-button" + (item.ambiguous ? " ambiguous" : ""),
      "data-route": item.route,
      "aria-current": item.route === state.selected ? "true" : null,
      onclick: () => selectRoute(item.route),
    },
    h("span", { class: "route-name", text: item.route }),
    h("span", { class: "badge badge-" + (item.ambiguous ? "ambiguous" : item.kind), text: badge }),
    h("span", { class: "route-meta", text: summaryText(item) }));
    return h("li", {}, button);
  }));
  if (!shown.length) {
    list.append(h("li", { class: "empty", text: state.routes.length ? "No route matches." : "No routes loaded." }));
  }
  if (focused) {
    const again = list.querySelector('button[data-route="' + CSS.escape(focused) + '"]');
    if (again) again.focus();
  }
}

export function markSelected() {
  for (const button of document.querySelectorAll(".route-button")) {
    if (button.dataset.route === state.selected) button.setAttribute("aria-current", "true");
    else button.removeAttribute("aria-current");
  }
}

export async function refreshListQuietly() {
  const items = [];
  for (let page = 1; page <= 1000; page++) {
    const result = await api("GET", "config?page=" + page + "&pageSize=" + PAGE_SIZE);
    if (!result.ok) return;
    const got = (result.data && result.data.items) || [];
    items.push(...got);
    if (!got.length || items.length >= (result.data.total || 0)) break;
  }
  state.routes = items;
  renderList();
}
