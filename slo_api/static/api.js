// Calls to slo-api: fetch and the error envelope, nothing the page shows. Every URL is relative
// to the page (`config?...`, `routes/NAME`), so the page works behind a gateway that rewrites a
// path prefix.

import { API, state } from "./state.js";

export async function api(method, path, options) {
  const opts = options || {};
  const headers = { Accept: "application/json", ...(opts.headers || {}) };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  let body;
  if (opts.body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(opts.body);
  }
  let response;
  try {
    response = await fetch(API + path, { method, headers, body, cache: "no-store", credentials: "omit" });
  } catch (err) {
    return { status: 0, ok: false, headers: new Headers(), data: null,
             error: { code: "network", message: "The service could not be reached: " + err.message } };
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = text; }
  }
  const result = { status: response.status, ok: response.ok, headers: response.headers, data, error: null };
  if (!response.ok) {
    const env = data && typeof data === "object" && data.error ? data.error : null;
    result.error = env || { code: "http_" + response.status,
                            message: typeof data === "string" && data ? data : response.statusText };
    result.error.requestId = response.headers.get("X-Request-Id");
  }
  return result;
}
