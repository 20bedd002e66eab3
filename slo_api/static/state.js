// The page's shared state and constants.

export const TOKEN_KEY = "slo-api.token";
export const PAGE_SIZE = 200;
export const METRIC_TYPES = ["avg", "p50", "p80", "p90", "p95", "p99"];
export const BOUND_TYPES = {
  llm: { min: ["replica", "concurrency", "pdengine"], max: ["replica", "pdengine"] },
  job: { min: ["replica", "concurrency"], max: ["replica"] },
};
export const SECTION_TITLES = {
  ttft: "TTFT: time to first token (seconds)",
  otps: "OTPS: output tokens per second",
};
export const KIND_LABELS = { llm: "LLM", job: "Job", pool: "Pool" };
// Served at .../demo-webui; if reached as .../demo-webui/ step up one level.
export const API = location.pathname.endsWith("/") ? "../" : "";

export const $ = (id) => document.getElementById(id);
export const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  routes: [],
  selected: null, // route name
  original: null, // the route as the API last returned it
  draft: null, // the form's values (numbers kept as typed strings)
  etag: null,
  seq: 0,
  writing: false, // a PUT or DELETE of the open route is in flight
  missed: null, // the live change to the open route that arrived meanwhile
};
