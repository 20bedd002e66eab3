// The page's shared state, its constants, and the event bus the layers above talk through: a
// lower module announces what happened and never calls up into the one that reacts.

export const TOKEN_KEY = "slo-api.token";
export const PAGE_SIZE = 200;
export const SECTION_TITLES = {
  ttft: "TTFT: time to first token (seconds)",
  otps: "OTPS: output tokens per second",
};
export const KIND_LABELS = { llm: "LLM", job: "Job", pool: "Pool" };
// Served at .../demo-webui; if reached as .../demo-webui/ step up one level.
export const API = location.pathname.endsWith("/") ? "../" : "";

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
  sort: "name", // or "budget": the order of GET config?view=attainment&sort=budget
  budgets: null, // route -> { rank, budget, status } while the list is sorted by budget
};

// -- events (app.js names who listens to what)

const listeners = new Map();

export function on(name, listener) {
  if (!listeners.has(name)) listeners.set(name, []);
  listeners.get(name).push(listener);
}

export function emit(name, detail) {
  for (const listener of listeners.get(name) || []) listener(detail);
}
