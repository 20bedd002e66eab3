// slo-api demo page: list routes, edit one, save with If-Match, reset.
// Plain ES2020, no build step, no external requests. Every API URL is relative to the page
// (`config?...`, `routes/NAME`), so the page works behind a gateway that rewrites a path prefix.
"use strict";

(function () {
  const TOKEN_KEY = "slo-api.token";
  const PAGE_SIZE = 200;
  const METRIC_TYPES = ["avg", "p50", "p80", "p90", "p95", "p99"];
  const BOUND_TYPES = {
    llm: { min: ["replica", "concurrency", "pdengine"], max: ["replica", "pdengine"] },
    job: { min: ["replica", "concurrency"], max: ["replica"] },
  };
  const SECTION_TITLES = {
    ttft: "TTFT: time to first token (seconds)",
    otps: "OTPS: output tokens per second",
  };
  const KIND_LABELS = { llm: "LLM", job: "Job", pool: "Pool" };
  // Served at .../demo-webui; if reached as .../demo-webui/ step up one level.
  const API = location.pathname.endsWith("/") ? "../" : "";

  const $ = (id) => document.getElementById(id);
  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    routes: [],
    selected: null, // route name
    original: null, // the route as the API last returned it
    draft: null, // the form's values (numbers kept as typed strings)
    etag: null,
    seq: 0,
  };

  // ---------------------------------------------------------------- DOM helpers

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") el.textContent = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "value") el.value = value;
      else if (key === "checked") el.checked = true;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function idFor(path) {
    return "f-" + path.replace(/[^A-Za-z0-9]+/g, "-");
  }

  function errorSlot(id) {
    return h("p", { class: "field-error", id: id + "-err", hidden: true });
  }

  function clone(value) {
    return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
  }

  function canonical(value) {
    if (Array.isArray(value)) return value.map(canonical);
    if (value && typeof value === "object") {
      const out = {};
      for (const key of Object.keys(value).sort()) {
        const v = value[key];
        if (v === null || v === undefined || (Array.isArray(v) && v.length === 0)) continue;
        out[key] = canonical(v);
      }
      return out;
    }
    return value;
  }

  function same(a, b) {
    return JSON.stringify(canonical(a === undefined ? null : a)) ===
      JSON.stringify(canonical(b === undefined ? null : b));
  }

  // ---------------------------------------------------------------- status area

  function setStatus(message, level, actions) {
    const status = $("status");
    status.className = "status " + (level || "info");
    status.textContent = message || "";
    const box = $("status-actions");
    box.replaceChildren(...(actions || []));
  }

  // ---------------------------------------------------------------- API

  async function api(method, path, options) {
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

  function describe(error) {
    const rid = error.requestId ? " (request " + error.requestId + ")" : "";
    return (error.message || error.code || "Request failed") + rid;
  }

  // Common answers for any call; returns true when handled.
  function handleCommon(result) {
    if (result.status === 401) {
      setStatus("The token was not accepted. Enter a valid API token.", "error");
      setTokenState(false);
      $("token-input").focus();
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

  // ---------------------------------------------------------------- token

  function setTokenState(ok) {
    $("token-state").textContent = state.token ? (ok === false ? "Token rejected" : "Token set for this tab")
                                               : "No token";
  }

  function initToken() {
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
      loadRoutes().then(() => { if (state.selected) selectRoute(state.selected, true); });
    });
    $("token-forget").addEventListener("click", () => {
      state.token = "";
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

  // ---------------------------------------------------------------- route list

  async function loadRoutes() {
    if (!state.token) {
      setStatus("Enter the API token to load the routes.", "info");
      return;
    }
    setStatus("Loading routes…", "info");
    const items = [];
    for (let page = 1; page <= 1000; page++) {
      const result = await api("GET", "config?page=" + page + "&pageSize=" + PAGE_SIZE);
      if (!result.ok) {
        if (!handleCommon(result)) setStatus("Could not load the routes: " + describe(result.error), "error");
        return;
      }
      const body = result.data || {};
      const got = Array.isArray(body.items) ? body.items : [];
      items.push(...got);
      if (got.length === 0 || items.length >= (body.total || 0)) break;
    }
    state.routes = items;
    renderList();
    setStatus("Loaded " + items.length + " route" + (items.length === 1 ? "" : "s") + ".", "info");
  }

  function boundText(bound) {
    return bound ? bound.value + " " + (bound.type || "replica") : "none";
  }

  function summaryText(item) {
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

  function renderList() {
    const kind = $("kind-filter").value;
    const needle = $("search").value.trim().toLowerCase();
    const shown = state.routes.filter((item) => {
      if (needle && !String(item.route).toLowerCase().includes(needle)) return false;
      if (!kind) return true;
      if (kind === "ambiguous") return !!item.ambiguous;
      return item.ambiguous ? (item.kinds || []).includes(kind) : item.kind === kind;
    });
    $("route-count").textContent = state.routes.length
      ? "(" + shown.length + (shown.length === state.routes.length ? "" : " of " + state.routes.length) + ")"
      : "";
    const list = $("route-list");
    list.replaceChildren(...shown.map((item) => {
      const badge = item.ambiguous ? "Conflict" : (KIND_LABELS[item.kind] || item.kind);
      const button = h("button", {
        type: "button", class: "route-button" + (item.ambiguous ? " ambiguous" : ""),
        "data-route": item.route,
        "aria-current": item.route === state.selected ? "true" : null,
        onclick: () => selectRoute(item.route),
      },
      h("span", { class: "route-name", text: item.route }),
      h("span", { class: "badge badge-" + (item.ambiguous ? "ambiguous" : item.kind), text: badge }),
      h("span", { class: "route-meta", text: summaryText(item) }));
      return h("li", {}, button);
    }));
    if (!shown.length) {
      list.append(h("li", { class: "empty", text: state.routes.length ? "No route matches." : "No routes loaded." }));
    }
  }

  function markSelected() {
    for (const button of document.querySelectorAll(".route-button")) {
      if (button.dataset.route === state.selected) button.setAttribute("aria-current", "true");
      else button.removeAttribute("aria-current");
    }
  }

  // ---------------------------------------------------------------- selecting a route

  function dirty() {
    return state.original && state.draft && Object.keys(buildBody(true).body).length > 0;
  }

  async function selectRoute(route, force) {
    if (!force && route !== state.selected && dirty() &&
        !confirm("Discard the unsaved changes to " + state.selected + "?")) {
      return;
    }
    state.selected = route;
    const seq = ++state.seq;
    markSelected();
    history.replaceState(null, "", "#" + encodeURIComponent(route));
    $("editor-heading").textContent = route;
    const result = await api("GET", "routes/" + encodeURIComponent(route));
    if (seq !== state.seq) return;
    if (!result.ok) {
      state.original = state.draft = state.etag = null;
      if (handleCommon(result)) return;
      const what = result.status === 409 ? "This route is claimed by more than one resource"
        : result.status === 404 ? "This route does not exist (any more)" : "Could not load the route";
      showPlaceholder(what + ": " + describe(result.error));
      setStatus(what + ".", "error");
      return;
    }
    loadInto(result);
    setStatus("Loaded " + route + ".", "info");
  }

  function loadInto(result) {
    state.original = result.data;
    state.draft = toDraft(result.data);
    state.etag = result.headers.get("ETag");
    renderEditor();
  }

  function showPlaceholder(text) {
    $("editor-body").replaceChildren(h("p", { class: "hint", text }));
  }

  // Numbers become strings while they are edited, so a half-typed value is kept as typed.
  function toDraft(route) {
    const d = clone(route);
    const str = (v) => (v === undefined || v === null ? "" : String(v));
    if (d.kind === "pool") {
      const p = d.pool || {};
      d.pool = { ...p, default: str(p.default), swapPolicy: p.swapPolicy || "sticky",
                 swapBudget: str(p.swapBudget), reclaimAfter: str(p.reclaimAfter) };
      return d;
    }
    d.priority = str(d.priority);
    const bound = (b) => (b ? { type: b.type || "replica", value: str(b.value) } : null);
    d.minimumDeployment = bound(d.minimumDeployment) || { type: "replica", value: "1" };
    d.maximumDeployment = bound(d.maximumDeployment);
    const metrics = (ms) => (ms || []).map((m) => ({ type: m.type, threshold: str(m.threshold) }));
    for (const name of ["ttft", "otps"]) {
      const s = d[name];
      if (!s) { d[name] = null; continue; }
      d[name] = {
        default: { metrics: metrics(s.default && s.default.metrics) },
        ranges: (s.ranges || []).map((r) => ({
          contextLengthRangeLow: str(r.contextLengthRangeLow),
          contextLengthRangeHigh: str(r.contextLengthRangeHigh),
          metrics: metrics(r.metrics),
        })),
      };
    }
    if (d.queue) d.queue = { maxDepth: str(d.queue.maxDepth), promql: str(d.queue.promql) };
    return d;
  }

  // ---------------------------------------------------------------- building the PUT body

  function parseNumber(raw, path, errors, integer) {
    const text = String(raw).trim();
    const value = Number(text);
    if (text === "" || !Number.isFinite(value)) {
      errors.push({ field: path, message: integer ? "Enter a whole number." : "Enter a number." });
      return null;
    }
    return value;
  }

  function sectionBody(section, name, errors) {
    if (!section) return null;
    const metrics = (ms, base) => ms.map((m, i) => ({
      type: m.type,
      threshold: parseNumber(m.threshold, base + "." + i + ".threshold", errors, false),
    }));
    const out = { default: { metrics: metrics(section.default.metrics, name + ".default.metrics") } };
    if (section.ranges.length) {
      out.ranges = section.ranges.map((r, i) => {
        const base = name + ".ranges." + i;
        const range = {
          contextLengthRangeLow: parseNumber(r.contextLengthRangeLow, base + ".contextLengthRangeLow", errors, true),
          metrics: metrics(r.metrics, base + ".metrics"),
        };
        if (String(r.contextLengthRangeHigh).trim() !== "") {
          range.contextLengthRangeHigh = parseNumber(r.contextLengthRangeHigh, base + ".contextLengthRangeHigh", errors, true);
        }
        return range;
      });
    }
    return out;
  }

  // The fields that differ from what was loaded; whole sections for ttft, otps and queue.
  function buildBody(quiet) {
    const d = state.draft;
    const o = state.original;
    const errors = [];
    const body = {};
    if (d.kind === "pool") {
      const pool = {};
      const p = d.pool;
      const orig = o.pool || {};
      const opt = (v) => (String(v).trim() === "" ? null : String(v).trim());
      const fields = { default: opt(p.default), swapPolicy: p.swapPolicy,
                       swapBudget: String(p.swapBudget).trim(), reclaimAfter: opt(p.reclaimAfter) };
      for (const [key, value] of Object.entries(fields)) {
        if (!same(value, orig[key])) pool[key] = value;
      }
      if (Object.keys(pool).length) body.pool = pool;
      return { body, errors };
    }
    const priority = parseNumber(d.priority, "priority", errors, true);
    if (priority === null || priority !== o.priority) body.priority = priority;
    const bound = (b, path) => (b ? { type: b.type, value: parseNumber(b.value, path + ".value", errors, true) } : null);
    const min = bound(d.minimumDeployment, "minimumDeployment");
    const max = bound(d.maximumDeployment, "maximumDeployment");
    if (!same(min, o.minimumDeployment)) body.minimumDeployment = min;
    if (!same(max, o.maximumDeployment)) body.maximumDeployment = max;
    if (d.kind === "llm") {
      for (const name of ["ttft", "otps"]) {
        const section = sectionBody(d[name], name, errors);
        if (!same(section, o[name])) body[name] = section;
      }
    } else if (d.kind === "job" && d.queue) {
      const queue = { maxDepth: parseNumber(d.queue.maxDepth, "queue.maxDepth", errors, true),
                      promql: d.queue.promql };
      if (!same(queue, o.queue)) body.queue = queue;
    }
    if (quiet) return { body: errors.length ? { _invalid: true, ...body } : body, errors };
    return { body, errors };
  }

  // ---------------------------------------------------------------- field errors

  // `ttft.default.metrics[0].threshold`, `spec.ttft.default.metrics.0.threshold` and
  // `.maximumDeployment.value` all become the dotted path the form's controls carry.
  function normalizeField(field) {
    return String(field || "")
      .replace(/\[(\d+)\]/g, ".$1")
      .replace(/^\.+/, "")
      .replace(/^(body|spec)\./, "")
      .replace(/\.+/g, ".");
  }

  function controlFor(field) {
    let path = normalizeField(field);
    if (!path) return null;
    const kind = state.draft && state.draft.kind;
    const candidates = [];
    if (kind === "pool" && !path.startsWith("pool.") && path !== "pool") candidates.push("pool." + path);
    if (path === "highPriority") candidates.push("priority");
    candidates.push(path);
    for (let candidate of candidates) {
      while (candidate) {
        const el = document.querySelector('#editor-body [data-field="' + CSS.escape(candidate) + '"]');
        if (el) return el;
        const cut = candidate.lastIndexOf(".");
        candidate = cut > 0 ? candidate.slice(0, cut) : "";
      }
    }
    return null;
  }

  function clearFieldErrors() {
    for (const slot of document.querySelectorAll("#editor-body .field-error")) {
      slot.textContent = "";
      slot.hidden = true;
    }
    for (const el of document.querySelectorAll("#editor-body [aria-invalid]")) {
      el.removeAttribute("aria-invalid");
      if (el.dataset.describedby) el.setAttribute("aria-describedby", el.dataset.describedby);
      else el.removeAttribute("aria-describedby");
    }
  }

  function showFieldError(el, message) {
    const slot = $(el.dataset.errorSlot);
    if (!slot) return false;
    slot.textContent = slot.textContent ? slot.textContent + " " + message : message;
    slot.hidden = false;
    if (/^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) {
      el.setAttribute("aria-invalid", "true");
      const ids = new Set((el.getAttribute("aria-describedby") || "").split(/\s+/).filter(Boolean));
      ids.add(slot.id);
      el.setAttribute("aria-describedby", [...ids].join(" "));
    }
    return true;
  }

  // "ttft.default.metrics.0.threshold: must be >= 0" reads as "must be >= 0" beside the field.
  function withoutField(message, field) {
    const text = String(message || "");
    for (const prefix of [String(field || ""), normalizeField(field)]) {
      if (prefix && text.startsWith(prefix + ": ")) return text.slice(prefix.length + 2);
    }
    return text;
  }

  // Shows each cause next to its control; returns the messages no control took.
  function showErrors(error) {
    clearFieldErrors();
    const causes = Array.isArray(error.causes) && error.causes.length ? error.causes
      : [{ field: error.field, message: error.message }];
    const unplaced = [];
    let first = null;
    for (const cause of causes) {
      const el = cause.field ? controlFor(cause.field) : null;
      if (el && showFieldError(el, withoutField(cause.message || error.message, cause.field))) {
        if (!first) first = el;
      } else {
        unplaced.push((cause.field ? cause.field + ": " : "") + (cause.message || ""));
      }
    }
    if (first) {
      const target = /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(first.tagName) ? first
        : first.querySelector("input, select, textarea, button") || first;
      target.focus();
    }
    return unplaced;
  }

  // ---------------------------------------------------------------- the editor form

  function control(tag, path, attrs, ...children) {
    const id = idFor(path);
    return h(tag, { id, name: path, "data-field": path, "data-error-slot": id + "-err", ...attrs }, ...children);
  }

  function fieldRow(labelText, controlEl, hint) {
    const hintEl = hint ? h("p", { class: "hint", id: controlEl.id + "-hint", text: hint }) : null;
    if (hintEl) {
      controlEl.setAttribute("aria-describedby", hintEl.id);
      controlEl.dataset.describedby = hintEl.id;
    }
    return h("div", { class: "field" },
      h("label", { for: controlEl.id, text: labelText }), controlEl, hintEl, errorSlot(controlEl.id));
  }

  function group(path, legend, ...children) {
    const id = idFor(path) + "-group";
    return h("fieldset", { class: "group", "data-field": path, "data-error-slot": id + "-err", id },
      h("legend", { text: legend }), errorSlot(id), ...children);
  }

  function bind(el, obj, key, after) {
    el.addEventListener(el.tagName === "SELECT" ? "change" : "input", () => {
      obj[key] = el.value;
      if (after) after(el.value);
    });
    return el;
  }

  function options(values, selected, labels) {
    return values.map((v) => h("option", { value: v, selected: v === selected ? true : null,
                                          text: labels && labels[v] !== undefined ? labels[v] : v }));
  }

  function rerender(focusId) {
    const scroll = window.scrollY;
    renderEditor();
    window.scrollTo(0, scroll);
    const el = focusId && $(focusId);
    if (el) el.focus();
  }

  function renderEditor() {
    const d = state.draft;
    if (!d) return;
    const kind = d.kind;
    const form = h("form", { id: "route-form", class: "route-form", novalidate: true,
                             "aria-labelledby": "editor-heading" });
    form.addEventListener("submit", (event) => { event.preventDefault(); save(); });
    $("editor-heading").replaceChildren(d.route + " ",
      h("span", { class: "badge badge-" + kind, text: KIND_LABELS[kind] || kind }));
    if (kind === "pool") {
      form.append(poolFields(d));
    } else {
      form.append(priorityFields(d), boundsFields(d, kind));
      if (kind === "llm") form.append(sectionFields(d, "ttft"), sectionFields(d, "otps"));
      if (kind === "job") form.append(queueFields(d));
      if (d.pool) form.append(memberPoolInfo(d.pool));
    }
    form.append(h("div", { class: "actions" },
      h("button", { type: "submit", class: "primary", text: "Save" }),
      h("button", { type: "button", class: "secondary", text: "Reload", onclick: () => selectRoute(d.route, true) }),
      h("button", { type: "button", class: "danger", text: "Reset to defaults…", onclick: resetRoute })));
    $("editor-body").replaceChildren(form);
  }

  function priorityFields(d) {
    const number = control("input", "priority", { type: "number", min: 0, max: 10, step: 1,
                                                  inputmode: "numeric", value: d.priority });
    const toggle = h("input", { type: "checkbox", id: "f-highPriority", "data-field": "highPriority",
                                "data-error-slot": "f-priority-err", checked: d.priority === "10" });
    bind(number, d, "priority", (v) => { toggle.checked = String(v).trim() === "10"; });
    toggle.addEventListener("change", () => {
      if (toggle.checked) d.priority = "10";
      else if (String(d.priority).trim() === "10") d.priority = "0";
      number.value = d.priority;
    });
    return group("priority-group", "Priority",
      h("div", { class: "inline" },
        fieldRow("Priority (0 to 10)", number),
        h("div", { class: "field checkbox" }, toggle, h("label", { for: "f-highPriority", text: "High priority (10)" }))));
  }

  function boundsFields(d, kind) {
    const types = BOUND_TYPES[kind];
    const boundEditor = (bound, path, typesList) => h("div", { class: "inline" },
      fieldRow("Type", bind(control("select", path + ".type", {}, options(typesList, bound.type)), bound, "type")),
      fieldRow("Value", bind(control("input", path + ".value", { type: "number", min: 0, step: 1,
                                                                   inputmode: "numeric", value: bound.value }), bound, "value")));
    const minGroup = group("minimumDeployment", "Minimum deployment",
      boundEditor(d.minimumDeployment, "minimumDeployment", types.min),
      h("p", { class: "hint", text: "0 lets the service scale to zero." }));
    let maxGroup;
    if (d.maximumDeployment) {
      maxGroup = group("maximumDeployment", "Maximum deployment",
        boundEditor(d.maximumDeployment, "maximumDeployment", types.max),
        h("button", { type: "button", class: "secondary small", id: "max-remove", text: "Remove maximum",
                      onclick: () => { d.maximumDeployment = null; rerender("max-add"); } }));
    } else {
      maxGroup = group("maximumDeployment", "Maximum deployment",
        h("p", { class: "hint", text: "No maximum: the service is opted out of autoscaling." }),
        h("button", { type: "button", class: "secondary small", id: "max-add", text: "Add maximum",
                      onclick: () => {
                        const minValue = Number(d.minimumDeployment.value) || 1;
                        d.maximumDeployment = { type: types.max.includes(d.minimumDeployment.type)
                          ? d.minimumDeployment.type : "replica", value: String(Math.max(minValue, 1)) };
                        rerender(idFor("maximumDeployment.value"));
                      } }));
    }
    return h("div", { class: "bounds" }, minGroup, maxGroup);
  }

  function metricsTable(metrics, path, caption) {
    const rows = metrics.map((m, i) => {
      const base = path + "." + i;
      const typeSel = bind(control("select", base + ".type", { "aria-label": caption + " " + (i + 1) + " type" },
        options(METRIC_TYPES, m.type)), m, "type");
      const threshold = bind(control("input", base + ".threshold", {
        type: "number", min: 0, step: "any", inputmode: "decimal", value: m.threshold,
        "aria-label": caption + " " + (i + 1) + " threshold" }), m, "threshold");
      return h("tr", {},
        h("td", {}, typeSel, errorSlot(typeSel.id)),
        h("td", {}, threshold, errorSlot(threshold.id)),
        h("td", {}, h("button", {
          type: "button", class: "secondary small", text: "Remove",
          "aria-label": "Remove " + caption.toLowerCase() + " " + (i + 1),
          onclick: () => { metrics.splice(i, 1); rerender(idFor(path) + "-add"); } })));
    });
    const table = h("table", { class: "metrics" },
      h("caption", { class: "visually-hidden", text: caption }),
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Type" }), h("th", { scope: "col", text: "Threshold" }),
        h("th", { scope: "col" }, h("span", { class: "visually-hidden", text: "Actions" })))),
      h("tbody", {}, rows));
    const add = h("button", { type: "button", class: "secondary small", id: idFor(path) + "-add",
      text: "Add metric", "aria-label": "Add " + caption.toLowerCase(),
      onclick: () => {
        const used = new Set(metrics.map((m) => m.type));
        metrics.push({ type: METRIC_TYPES.find((t) => !used.has(t)) || "p90", threshold: "" });
        rerender(idFor(path + "." + (metrics.length - 1) + ".threshold"));
      } });
    const wrapId = idFor(path) + "-wrap";
    return h("div", { class: "metrics-wrap", "data-field": path, "data-error-slot": wrapId + "-err", id: wrapId },
      metrics.length ? table : h("p", { class: "hint", text: "No metrics: add at least one." }),
      errorSlot(wrapId), add);
  }

  function sectionFields(d, name) {
    const title = SECTION_TITLES[name];
    const label = name.toUpperCase();
    const section = d[name];
    if (!section) {
      return group(name, title,
        h("p", { class: "hint", text: "Not set." }),
        h("button", { type: "button", class: "secondary small", id: "f-" + name + "-add", text: "Add " + label + " targets",
          onclick: () => {
            d[name] = { default: { metrics: [{ type: name === "ttft" ? "p90" : "avg", threshold: "" }] }, ranges: [] };
            rerender(idFor(name + ".default.metrics.0.threshold"));
          } }));
    }
    const ranges = section.ranges.map((r, i) => {
      const base = name + ".ranges." + i;
      return group(base, label + " range " + (i + 1),
        h("div", { class: "inline" },
          fieldRow("From context length", bind(control("input", base + ".contextLengthRangeLow", {
            type: "number", min: 0, step: 1, inputmode: "numeric", value: r.contextLengthRangeLow }), r, "contextLengthRangeLow")),
          fieldRow("To context length", bind(control("input", base + ".contextLengthRangeHigh", {
            type: "number", min: 1, step: 1, inputmode: "numeric", value: r.contextLengthRangeHigh }), r, "contextLengthRangeHigh"),
            "Empty: no upper end.")),
        metricsTable(r.metrics, base + ".metrics", label + " range " + (i + 1) + " metric"),
        h("button", { type: "button", class: "secondary small", text: "Remove range " + (i + 1),
          onclick: () => { section.ranges.splice(i, 1); rerender("f-" + name + "-range-add"); } }));
    });
    return group(name, title,
      h("h3", { text: "Default" }),
      metricsTable(section.default.metrics, name + ".default.metrics", label + " default metric"),
      h("h3", { text: "By context length" }),
      ranges.length ? ranges : h("p", { class: "hint", text: "No ranges: the default applies to every request." }),
      h("div", { class: "inline" },
        h("button", { type: "button", class: "secondary small", id: "f-" + name + "-range-add", text: "Add range",
          onclick: () => {
            const last = section.ranges[section.ranges.length - 1];
            section.ranges.push({ contextLengthRangeLow: last ? last.contextLengthRangeHigh || "" : "0",
                                  contextLengthRangeHigh: "",
                                  metrics: [{ type: section.default.metrics[0] ? section.default.metrics[0].type : "p90", threshold: "" }] });
            rerender(idFor(name + ".ranges." + (section.ranges.length - 1) + ".contextLengthRangeLow"));
          } }),
        h("button", { type: "button", class: "danger small", text: "Remove " + label + " targets",
          onclick: () => { d[name] = null; rerender("f-" + name + "-add"); } })));
  }

  function queueFields(d) {
    if (!d.queue) d.queue = { maxDepth: "0", promql: "" };
    return group("queue", "Queue",
      h("div", { class: "inline" },
        fieldRow("Max depth", bind(control("input", "queue.maxDepth", { type: "number", min: 0, step: 1,
          inputmode: "numeric", value: d.queue.maxDepth }), d.queue, "maxDepth"), "Pending jobs per replica; 0 = not configured.")),
      fieldRow("PromQL query", bind(control("input", "queue.promql", { type: "text", class: "mono wide",
        spellcheck: "false", autocomplete: "off", value: d.queue.promql }), d.queue, "promql"), "Returns the queue depth."));
  }

  function yesNo(v) {
    return v === true ? "yes" : v === false ? "no" : "–";
  }

  function memberPoolInfo(pool) {
    return h("section", { class: "group readonly", "aria-labelledby": "pool-info-h" },
      h("h3", { id: "pool-info-h", text: "Model pool (read-only)" }),
      h("dl", { class: "facts" },
        h("dt", { text: "Pool" }), h("dd", {}, pool.route || "–", " ",
          pool.route ? h("button", { type: "button", class: "link", text: "Open pool",
                                     onclick: () => selectRoute(pool.route) }) : null),
        h("dt", { text: "Resident" }), h("dd", { text: yesNo(pool.resident) }),
        h("dt", { text: "Phase" }), h("dd", { text: pool.phase || "–" })));
  }

  function poolFields(d) {
    const p = d.pool;
    const members = p.members || [];
    const memberOptions = [h("option", { value: "", text: "(none: the first request picks)", selected: p.default === "" ? true : null })]
      .concat(members.map((m) => h("option", { value: m, text: m, selected: m === p.default ? true : null })));
    if (p.default && !members.includes(p.default)) {
      memberOptions.push(h("option", { value: p.default, text: p.default + " (not a member)", selected: true }));
    }
    const policies = ["sticky", "reclaim"];
    if (p.swapPolicy && !policies.includes(p.swapPolicy)) policies.push(p.swapPolicy);
    const settings = group("pool", "Pool settings",
      fieldRow("Default member", bind(control("select", "pool.default", {}, memberOptions), p, "default"),
        "Warmed on a cold pool."),
      fieldRow("Swap policy", bind(control("select", "pool.swapPolicy", {}, options(policies, p.swapPolicy)), p, "swapPolicy")),
      h("div", { class: "inline" },
        fieldRow("Swap budget", bind(control("input", "pool.swapBudget", { type: "text", class: "mono", spellcheck: "false",
          autocomplete: "off", value: p.swapBudget }), p, "swapBudget"), "A duration, e.g. 90s, 5m, 1h30m."),
        fieldRow("Reclaim after", bind(control("input", "pool.reclaimAfter", { type: "text", class: "mono", spellcheck: "false",
          autocomplete: "off", value: p.reclaimAfter }), p, "reclaimAfter"), "Empty: not set. Used by the reclaim policy.")));
    const st = state.original.status || {};
    const memberRows = (st.members || []).map((m) => h("tr", {},
      h("th", { scope: "row", text: m.name }), h("td", { text: m.phase || "–" }), h("td", { text: yesNo(m.resident) })));
    const status = h("section", { class: "group readonly", "aria-labelledby": "pool-status-h" },
      h("h3", { id: "pool-status-h", text: "Status (read-only)" }),
      h("dl", { class: "facts", id: "pool-status" },
        h("dt", { text: "Members" }), h("dd", { text: members.join(", ") || "–" }),
        h("dt", { text: "GPUs" }), h("dd", { text: p.gpu === undefined || p.gpu === null ? "–" : String(p.gpu) }),
        h("dt", { text: "Phase" }), h("dd", { text: st.phase || "–" }),
        h("dt", { text: "Resident" }), h("dd", { text: st.residentMember || "none" }),
        h("dt", { text: "Pending" }), h("dd", { text: st.pendingMember || "none" })),
      memberRows.length ? h("table", { class: "members" },
        h("caption", { text: "Members as observed" }),
        h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Member" }), h("th", { scope: "col", text: "Phase" }),
          h("th", { scope: "col", text: "Resident" }))),
        h("tbody", {}, memberRows)) : h("p", { class: "hint", text: "No member status reported." }));
    return h("div", { class: "stack" }, settings, status);
  }

  // ---------------------------------------------------------------- save and reset

  async function save() {
    if (!state.draft) return;
    clearFieldErrors();
    const route = state.draft.route;
    const { body, errors } = buildBody(false);
    if (errors.length) {
      showErrors({ causes: errors });
      setStatus("Not saved: " + errors.length + " field" + (errors.length === 1 ? " needs" : "s need") + " a value.", "error");
      return;
    }
    const changed = Object.keys(body.pool || body);
    if (!changed.length) {
      setStatus("No changes to save.", "info");
      return;
    }
    setStatus("Saving " + route + "…", "info");
    const headers = state.etag ? { "If-Match": state.etag } : {};
    const result = await api("PUT", "routes/" + encodeURIComponent(route), { body, headers });
    if (route !== state.selected) return;
    if (result.ok) {
      const etag = result.headers.get("ETag");
      if (etag) {
        loadInto(result);
      } else {
        const fresh = await api("GET", "routes/" + encodeURIComponent(route));
        loadInto(fresh.ok ? fresh : result);
      }
      setStatus("Saved " + route + " (" + changed.join(", ") + ").", "success");
      refreshListQuietly();
      return;
    }
    if (result.status === 412) {
      setStatus("Not saved: " + route + " was changed elsewhere since you loaded it. " +
                "Reload to see the current values (your edits here will be lost).", "error",
                [h("button", { type: "button", class: "primary", text: "Reload route",
                               onclick: () => selectRoute(route, true) })]);
      return;
    }
    if (handleCommon(result)) return;
    const unplaced = showErrors(result.error);
    const extra = unplaced.length && unplaced.join("; ") !== result.error.message ? " " + unplaced.join("; ") : "";
    setStatus("Not saved: " + describe(result.error) + extra, "error");
  }

  async function resetRoute() {
    const route = state.draft && state.draft.route;
    if (!route) return;
    const what = state.draft.kind === "pool"
      ? "swap policy sticky, swap budget 300s, no default and no reclaim delay"
      : "priority 0, minimum 1 replica, no maximum" + (state.draft.kind === "llm" ? ", no TTFT/OTPS targets" : "");
    if (!confirm("Reset " + route + " to the defaults (" + what + ")?")) return;
    const headers = state.etag ? { "If-Match": state.etag } : {};
    const result = await api("DELETE", "routes/" + encodeURIComponent(route), { headers });
    if (result.ok) {
      await selectRoute(route, true);
      setStatus("Reset " + route + " to the defaults.", "success");
      refreshListQuietly();
      return;
    }
    if (result.status === 412) {
      setStatus("Not reset: " + route + " was changed elsewhere since you loaded it.", "error",
                [h("button", { type: "button", class: "primary", text: "Reload route",
                               onclick: () => selectRoute(route, true) })]);
      return;
    }
    if (!handleCommon(result)) setStatus("Not reset: " + describe(result.error), "error");
  }

  async function refreshListQuietly() {
    const items = [];
    for (let page = 1; page <= 1000; page++) {
      const result = await api("GET", "config?page=" + page + "&pageSize=" + PAGE_SIZE);
      if (!result.ok) return;
      const got = (result.data && result.data.items) || [];
      items.push(...got);
      if (!got.length || items.length >= (result.data.total || 0)) break;
    }
    state.routes = items;
    renderList();
  }

  // ---------------------------------------------------------------- start

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
    loadRoutes().then(() => { if (fromHash && state.token) selectRoute(fromHash, true); });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
