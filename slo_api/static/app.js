// slo-api demo page: list routes, edit one, save with If-Match, reset; follow changes live.
// Plain ES2020 modules, no build step, no external requests. This module wires them: the ones
// below announce events (state.js's bus) and it says who acts on each. The layers, bottom up:
// state, dom, status, api; the models (routes, schema); the views (list, form, history, token,
// and their helpers); the controllers (editor, live); this.

import { state, on } from "./state.js";
import { $ } from "./dom.js";
import { setStatus, describe, handleCommon } from "./status.js";
import { fetchSummaries, fetchByBudget, budgetOf, replaceRoutes } from "./routes.js";
import { renderList, markSelected } from "./list.js";
import { initToken, tokenRejected } from "./token.js";
import { selectRoute, showPlaceholder, routeChanged, save, resetRoute } from "./editor.js";
import { startLive, stopLive } from "./live.js";

async function loadRoutes() {
  if (!state.token) {
    setStatus("Enter the API token to load the routes.", "info");
    return;
  }
  setStatus("Loading routes…", "info");
  const result = await fetchSummaries();
  if (!result.ok) {
    if (!handleCommon(result)) setStatus("Could not load the routes: " + describe(result.error), "error");
    return;
  }
  const items = result.items;
  if (state.sort === "budget") await loadBudgets();
  replaceRoutes(items);
  setStatus("Loaded " + items.length + " route" + (items.length === 1 ? "" : "s") + ".", "info");
}

// The list's budget order, read when it is asked for (and with every reload while it is).
async function loadBudgets() {
  const result = await fetchByBudget();
  if (!result.ok) {
    state.budgets = null;
    if (!handleCommon(result)) setStatus("Could not sort by budget: " + describe(result.error), "error");
    return;
  }
  state.budgets = new Map(result.items.map((item, rank) => [item.route, { rank, ...budgetOf(item) }]));
}

async function sortChanged() {
  state.sort = $("sort").value;
  if (state.sort === "budget" && state.token) await loadBudgets();
  renderList();
}

function wire() {
  on("routes", renderList);
  on("selected", markSelected);
  on("open", (route) => selectRoute(route));
  on("reload", (route) => selectRoute(route, true));
  on("save", save);
  on("reset", resetRoute);
  on("change", routeChanged);
  on("unauthorized", tokenRejected);
  on("token-set", () => loadRoutes().then(() => {
    startLive();
    if (state.selected) selectRoute(state.selected, true);
  }));
  on("token-forgotten", () => {
    stopLive();
    replaceRoutes([]);
    showPlaceholder("Enter the API token, then pick a route from the list.");
  });
}

function init() {
  wire();
  initToken();
  $("kind-filter").addEventListener("change", renderList);
  $("search").addEventListener("input", renderList);
  $("sort").addEventListener("change", sortChanged);
  $("refresh").addEventListener("click", () => loadRoutes());
  renderList();
  if (!state.token) {
    setStatus("Enter the API token to load the routes.", "info");
    $("token-input").focus();
    return;
  }
  const fromHash = location.hash.length > 1 ? decodeURIComponent(location.hash.slice(1)) : "";
  loadRoutes().then(() => {
    startLive();
    if (fromHash && state.token) selectRoute(fromHash, true);
  });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
else init();
