// The API token: kept in sessionStorage for this tab only.

import { TOKEN_KEY, $, state } from "./state.js";
import { setStatus } from "./api.js";
import { loadRoutes, renderList } from "./list.js";
import { selectRoute, showPlaceholder } from "./editor.js";
import { startLive, stopLive } from "./live.js";

export function setTokenState(ok) {
  $("token-state").textContent = state.token ? (ok === false ? "Token rejected" : "Token set for this tab")
                                             : "No token";
}

export function initToken() {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token-input").value.trim();
    if (!value) {
      setStatus("Enter a token first.", "error");
      $("token-input").focus();
      return;
    }
    state.token = value;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("token-input").value = "";
    setTokenState(true);
    loadRoutes().then(() => {
      startLive();
      if (state.selected) selectRoute(state.selected, true);
    });
  });
  $("token-forget").addEventListener("click", () => {
    state.token = "";
    stopLive();
    sessionStorage.removeItem(TOKEN_KEY);
    state.routes = [];
    renderList();
    showPlaceholder("Enter the API token, then pick a route from the list.");
    setTokenState();
    setStatus("Token forgotten.", "info");
    $("token-input").focus();
  });
  setTokenState();
}
