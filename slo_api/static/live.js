// Follows `GET config?watch=true` so the route list and the open route change as the routes do.
// fetch with a streamed body rather than EventSource, which cannot send the Authorization header.
// The stream is read in the full view: the open route needs every field, and the list derives
// its summary lines from the same items (summaryOf). A change to the open route is announced
// ("change", the event).

import { API, state, emit } from "./state.js";
import { $ } from "./dom.js";
import { applyChange, byRoute, routesChanged, setRoutes, summaryOf } from "./routes.js";
import { loadSchema } from "./schema.js";

const RETRY_MAX_MS = 15000;
// The server sends a bookmark at least every 5 s (WATCH_BOOKMARK_SECONDS): a stream silent
// for much longer than that is a dead connection nobody told us about (a sleeping laptop, a
// proxy that dropped it). It is cut and resumed, so the page never shows stale data forever.
const SILENCE_MS = 45000;

let controller = null;
let since = null; // the last revision read: a reconnect resumes after it
let renderPending = false;

export function stopLive() {
  if (controller) controller.abort();
  controller = null;
  showLive(false);
}

export function startLive() {
  stopLive();
  if (!state.token) return;
  since = null;
  const mine = new AbortController();
  controller = mine;
  follow(mine);
}

async function follow(mine) {
  let delay = 1000;
  while (controller === mine) {
    let outcome;
    try {
      outcome = await readStream(mine);
    } catch (err) {
      outcome = "lost";
    }
    if (controller !== mine) return;
    showLive(false);
    if (outcome === "unauthorized") return; // a new token starts over
    if (outcome === "expired") {
      since = null; // the server lost our place (it restarted): take the whole state again
      continue;
    }
    if (outcome === "final") {
      delay = 1000;
      continue;
    }
    if (outcome === "read") delay = 1000;
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, RETRY_MAX_MS);
  }
}

async function readStream(mine) {
  // This request alone is cut by the watchdog; stopLive cuts it through `mine`.
  const request = new AbortController();
  const cut = () => request.abort();
  mine.signal.addEventListener("abort", cut);
  let watchdog = setTimeout(cut, SILENCE_MS);
  const heard = () => {
    clearTimeout(watchdog);
    watchdog = setTimeout(cut, SILENCE_MS);
  };
  try {
    return await readEvents(request, heard);
  } finally {
    clearTimeout(watchdog);
    mine.signal.removeEventListener("abort", cut);
  }
}

async function readEvents(request, heard) {
  // Its items become summaries as the schema says (summaryOf): read it first.
  if (!(await loadSchema()).ok) return "lost";
  const url = API + "config?watch=true&view=full" + (since ? "&since=" + encodeURIComponent(since) : "");
  const response = await fetch(url, {
    headers: { Accept: "application/x-ndjson", Authorization: "Bearer " + state.token },
    cache: "no-store", credentials: "omit", signal: request.signal,
  });
  if (response.status === 401 || response.status === 403) return "unauthorized";
  if (response.status === 410) return "expired";
  if (!response.ok || !response.body) return "lost";
  showLive(true);
  // Without `since`, the stream opens with every route then an initial bookmark: that
  // snapshot replaces the list, catching up with whatever changed since it was loaded.
  let snapshot = since ? null : [];
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return "read";
    heard();
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (!line.trim()) continue;
      const event = JSON.parse(line);
      if (event.type === "ERROR") {
        const code = event.error && event.error.code;
        if (code === "unauthorized" || code === "forbidden") return "unauthorized";
        // What this token may see changed: take the whole state again.
        if (code === "expired") return "expired";
        return "lost"; // fell behind: resume from `since` (a 410 then starts over)
      }
      // A place inside the initial state is no place to resume from: a stream cut there
      // would come back without the rest of it. Take revisions from its bookmark on.
      if (event.revision && (!snapshot || event.type === "BOOKMARK")) since = event.revision;
      // The server ended the stream in order (its lifetime is over, or it stops): resume
      // from this bookmark at once.
      if (event.type === "BOOKMARK" && event.final && !snapshot) return "final";
      if (snapshot) {
        if (event.type === "ADDED") snapshot.push(summaryOf(event.object));
        else if (event.type === "BOOKMARK" && event.initial) {
          setRoutes(byRoute(snapshot));
          snapshot = null;
          scheduleRender();
        }
        continue;
      }
      if (event.type !== "BOOKMARK") apply(event);
    }
  }
}

function apply(event) {
  applyChange(event);
  scheduleRender();
  if (event.route === state.selected) emit("change", event);
}

// Many changes at once (a relist, a script) redraw the list once.
function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  setTimeout(() => {
    renderPending = false;
    routesChanged();
  }, 50);
}

function showLive(on) {
  const badge = $("live");
  if (!badge) return;
  badge.textContent = on ? "live" : "";
  badge.title = on ? "The list follows changes as they happen." : "";
}
