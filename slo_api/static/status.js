// The status line, and what it says about the answers every call can get.

import { emit } from "./state.js";
import { $ } from "./dom.js";

export function setStatus(message, level, actions) {
  const status = $("status");
  status.className = "status " + (level || "info");
  status.textContent = message || "";
  const box = $("status-actions");
  box.replaceChildren(...(actions || []));
}

export function describe(error) {
  const rid = error.requestId ? " (request " + error.requestId + ")" : "";
  // A message said of a field leaves the field out (`field: message` shows both).
  const field = error.field && error.message ? error.field + ": " : "";
  return field + (error.message || error.code || "Request failed") + rid;
}

// Common answers for any call; returns true when handled. A 401 is announced ("unauthorized"):
// the token's owner says so and asks for another.
export function handleCommon(result) {
  if (result.status === 401) {
    emit("unauthorized");
    return true;
  }
  if (result.status === 403) {
    setStatus("This token may not do that: " + describe(result.error), "error");
    return true;
  }
  if (result.status === 0 || result.status === 503 || result.status >= 500) {
    setStatus("The service could not answer: " + describe(result.error), "error");
    return true;
  }
  return false;
}
