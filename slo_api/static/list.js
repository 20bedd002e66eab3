// The route list as the route model holds it, filtered; a click announces "open" (a route).

import { KIND_LABELS, state, emit } from "./state.js";
import { $, h } from "./dom.js";
import { STATUS_LABELS, budgetText } from "./attainment.js";

export function boundText(bound) {
  return bound ? bound.value + " " + bound.type : "none"; // the server names the type
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

// By name (the model's order), or by the server's budget order: routes it gave no rank (pools,
// routes added since) after those it ranked, by name.
function ordered(routes) {
  const budgets = state.sort === "budget" ? state.budgets : null;
  if (!budgets) return routes;
  const rank = (item) => (budgets.has(item.route) ? budgets.get(item.route).rank : Infinity);
  return routes.slice().sort((a, b) => rank(a) - rank(b));
}

function budgetMeta(item) {
  const known = state.sort === "budget" && state.budgets ? state.budgets.get(item.route) : null;
  if (!known) return null;
  const budget = budgetText(known.budget);
  return h("span", { class: "route-budget" },
    known.status ? h("span", { class: "badge status-badge status-" + known.status,
                               text: STATUS_LABELS[known.status] || known.status }) : null,
    " " + budget);
}

export function renderList() {
  const kind = $("kind-filter").value;
  const needle = $("search").value.trim().toLowerCase();
  const shown = ordered(state.routes).filter((item) => {
    if (needle && !String(item.route).toLowerCase().includes(needle)) return false;
    if (!kind) return true;
    if (kind === "ambiguous") return !!item.ambiguous;
    return item.ambiguous ? (item.kinds || []).includes(kind) : item.kind === kind;
  });
  $("route-count").textContent = state.routes.length
    ? "(" + shown.length + (shown.length === state.routes.length ? "" : " of " + state.routes.length) + ")"
    : "";
  const list = $("route-list");
  // A redraw (on every live change) keeps the keyboard focus where it was.
  const focused = document.activeElement && list.contains(document.activeElement)
    ? document.activeElement.dataset.route : null;
  list.replaceChildren(...shown.map((item) => {
    const badge = item.ambiguous ? "Conflict" : (KIND_LABELS[item.kind] || item.kind);
    const button = h("button", {
      type: "button", class: "route-button" + (item.ambiguous ? " ambiguous" : ""),
      "data-route": item.route,
      "aria-current": item.route === state.selected ? "true" : null,
      onclick: () => emit("open", item.route),
    },
    h("span", { class: "route-name", text: item.route }),
    h("span", { class: "badge badge-" + (item.ambiguous ? "ambiguous" : item.kind), text: badge }),
    h("span", { class: "route-meta", text: summaryText(item) }),
    budgetMeta(item));
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
