// The API token: kept in sessionStorage for this tab only. A token entered is announced
// ("token-set"), as is one forgotten ("token-forgotten").

import { TOKEN_KEY, state, emit } from "./state.js";
import { $ } from "./dom.js";
import { setStatus } from "./status.js";

export function setTokenState(ok) {
  $("token-state").textContent = state.token ? (ok === false ? "Token rejected" : "Token set for this tab")
                                             : "No token";
}

// The service did not accept the token (an "unauthorized" answer).
export function tokenRejected() {
  setStatus("The token was not accepted. Enter a valid API token.", "error");
  setTokenState(false);
  $("token-input").focus();
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
    emit("token-set");
  });
  $("token-forget").addEventListener("click", () => {
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    emit("token-forgotten");
    setTokenState();
    setStatus("Token forgotten.", "info");
    $("token-input").focus();
  });
  setTokenState();
}
