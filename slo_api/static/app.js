// slo-api demo page: list routes, edit one, save with If-Match, reset; follow changes live.
// Plain ES2020 modules, no build step, no external requests.

import { $, state } from "./state.js";
import { setStatus } from "./api.js";
import { initToken } from "./token.js";
import { loadRoutes, renderList } from "./list.js";
import { selectRoute } from "./editor.js";
import { startLive } from "./live.js";

function init() {
  initToken();
  $("kind-filter").addEventListener("change", renderList);
  $("search").addEventListener("input", renderList);
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
