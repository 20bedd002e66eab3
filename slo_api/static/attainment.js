// The open route's attainment (GET routes/NAME/attainment): for each objective, what the service
// delivered over the window against its target, drawn here as SVG (no library), with the error
// budget left and the status. Figures come from slo-api's Prometheus; none are made up here.

import { state } from "./state.js";
import { $, h } from "./dom.js";
import { api } from "./api.js";
import { describe } from "./status.js";

export const WINDOWS = ["1h", "1d", "7d", "28d"];
const WINDOW_SECONDS = { "1h": 3600, "1d": 86400, "7d": 604800, "28d": 2419200 };
export const STATUS_LABELS = { met: "Met", at_risk: "At risk", violated: "Violated", no_data: "No data" };
const METRIC_NAMES = { ttft: "TTFT", otps: "OTPS", queue: "Queue depth" };
const SVG = "http://www.w3.org/2000/svg";
// The chart's box, in its own units (it scales with the page).
const BOX = { width: 480, height: 160, left: 72, right: 12, top: 10, bottom: 22 };

let shownWindow = "28d";

export function figure(value, metric) {
  if (typeof value !== "number" || !isFinite(value)) return "–";
  const text = Number(value.toPrecision(3)).toString();
  return metric === "ttft" ? text + " s" : metric === "otps" ? text + " tok/s" : text;
}

// "p90 ≤ 0.8 s": at most for TTFT and a queue, at least for OTPS.
export function targetText(obj) {
  const sign = obj.metric === "otps" ? "≥" : "≤";
  const kind = obj.type === "maxDepth" ? "depth" : obj.type;
  return kind + " " + sign + " " + figure(obj.threshold, obj.metric);
}

export function budgetText(value) {
  if (typeof value !== "number" || !isFinite(value)) return "no error budget";
  const percent = (Math.abs(value) * 100).toFixed(1) + "%";
  return value < 0 ? "budget overspent by " + percent : percent + " of budget left";
}

const NO_DATA = {
  no_series: "No series match this route's selector in the window.",
  no_traffic: "No requests in the window.",
};

function percent(value) {
  return (value * 100).toFixed(1) + "%";
}

// What an objective's figures rest on, each a sentence: why there is no data, the bounds of an
// interpolated good ratio, a window Prometheus holds only part of, and when the budget runs out
// at the 1h and 6h burn rates (nothing when it does at neither).
export function objectiveNotes(obj) {
  const notes = [];
  if (obj.reason === "insufficient_traffic") {
    notes.push("Too few requests to judge: " + Number(Number(obj.requests).toPrecision(3)) + " in the window.");
  } else if (NO_DATA[obj.reason]) {
    notes.push(NO_DATA[obj.reason]);
  }
  const bounds = obj.goodRatioBounds;
  if (obj.estimated && bounds && typeof obj.goodRatio === "number" && bounds.low !== bounds.high) {
    notes.push(percent(obj.goodRatio) + " within the target, estimated: between " +
      percent(bounds.low) + " and " + percent(bounds.high) + ".");
  }
  const coverage = obj.coverage;
  if (coverage && typeof coverage.fraction === "number" && coverage.fraction < 0.999) {
    notes.push("Prometheus holds " + percent(coverage.fraction) + " of the window (since " + coverage.since + ").");
  }
  const at = obj.exhaustsAt;
  if (at && (at["1h"] || at["6h"])) {
    const said = ["1h", "6h"].map((w, i) => {
      const rate = i === 0 ? "the " + w + " burn rate" : "the " + w + " rate";
      return at[w] ? "at " + rate + " the budget runs out at " + at[w] : "at " + rate + " it does not";
    });
    const text = said.join("; ");
    notes.push(text[0].toUpperCase() + text.slice(1) + ".");
  }
  return notes;
}

// Where the chart draws: the observed series as a path (a gap where a step had no requests), a
// dot for a point alone between gaps (a path of one point shows nothing), and the target's
// height, on a linear scale from 0 to a little above the highest of both. With `span` ({start,
// end, step}: the window up to the figures' asOf) the x axis is that window, whatever points
// came, and a point more than a step after the one before it starts a new line: the steps
// between had no point (no requests, or none yet), so nothing recent is drawn that is not there.
export function chartGeometry(series, threshold, box, span) {
  const points = (series || []).filter((p) => Array.isArray(p) && typeof p[0] === "number");
  const values = points.map((p) => p[1]).filter((v) => typeof v === "number" && isFinite(v));
  const top = Math.max(threshold || 0, ...values) * 1.15 || 1;
  const t0 = span ? span.start : points.length ? points[0][0] : 0;
  const t1 = span ? span.end : points.length ? points[points.length - 1][0] : 1;
  const apart = span && span.step ? span.step * 1.5 : Infinity;
  const plotW = box.width - box.left - box.right;
  const plotH = box.height - box.top - box.bottom;
  const x = (t) => box.left + (t1 > t0 ? ((t - t0) / (t1 - t0)) * plotW : plotW);
  const y = (v) => box.top + plotH - (v / top) * plotH;
  let path = "";
  const dots = [];
  let run = [];
  const flush = () => {
    if (run.length === 1) dots.push(run[0]);
    else if (run.length > 1) path += run.map((p, i) => (i ? "L" : "M") + p[0] + " " + p[1]).join(" ") + " ";
    run = [];
  };
  let previous = null;
  for (const [t, v] of points) {
    if (previous !== null && t - previous > apart) flush();
    previous = t;
    if (typeof v !== "number" || !isFinite(v)) { flush(); continue; }
    run.push([x(t).toFixed(1), y(v).toFixed(1)]);
  }
  flush();
  return { path: path.trim(), dots, targetY: y(threshold || 0), top, bottomY: y(0), count: values.length,
           low: values.length ? Math.min(...values) : null, high: values.length ? Math.max(...values) : null };
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// The window the answer covers: up to its figures' time (not the browser's clock), in steps as
// the server draws them (window / 200, at least 5 minutes).
function windowSpan(window, asOf) {
  const seconds = WINDOW_SECONDS[window];
  const end = asOf ? Date.parse(asOf) / 1000 : NaN;
  if (!seconds || !isFinite(end)) return undefined;
  return { start: end - seconds, end, step: Math.max(seconds / 200, 300) };
}

function chart(route, obj, window, index, asOf) {
  const g = chartGeometry(obj.series, obj.threshold, BOX, windowSpan(window, asOf));
  const name = METRIC_NAMES[obj.metric] || obj.metric;
  const id = "attainment-chart-" + index;
  const last = (obj.series || []).filter((p) => typeof p[1] === "number").pop();
  const said = g.count
    ? "Observed from " + figure(g.low, obj.metric) + " to " + figure(g.high, obj.metric) +
      " over " + window + (last ? ", latest " + figure(last[1], obj.metric) : "") +
      "; target " + targetText(obj) + "."
    : "No requests observed over " + window + "; target " + targetText(obj) + ".";
  const right = BOX.width - BOX.right;
  return svg("svg", { class: "attainment-chart", viewBox: "0 0 " + BOX.width + " " + BOX.height,
                      role: "img", "aria-labelledby": id + "-title " + id + "-desc",
                      "data-metric": obj.metric, "data-type": obj.type },
    svg("title", { id: id + "-title" }, route + ": " + name + " " + obj.type + " observed over " + window),
    svg("desc", { id: id + "-desc" }, said),
    svg("line", { class: "chart-axis", x1: BOX.left, x2: right, y1: g.bottomY, y2: g.bottomY }),
    svg("text", { class: "chart-label", x: BOX.left - 4, y: BOX.top + 8, "text-anchor": "end" },
        figure(g.top, obj.metric)),
    svg("text", { class: "chart-label", x: BOX.left - 4, y: g.bottomY, "text-anchor": "end" }, "0"),
    svg("text", { class: "chart-label", x: BOX.left, y: BOX.height - 4 }, window + " ago"),
    svg("text", { class: "chart-label chart-as-of", x: right, y: BOX.height - 4, "text-anchor": "end" },
        asOf ? "as of " + asOf.slice(11, 16) + " UTC" : "now"),
    svg("line", { class: "chart-target", x1: BOX.left, x2: right, y1: g.targetY, y2: g.targetY }),
    svg("text", { class: "chart-label chart-target-label", x: right, y: g.targetY - 4, "text-anchor": "end" },
        "target " + targetText(obj)),
    g.path ? svg("path", { class: "chart-observed", d: g.path }) : null,
    ...g.dots.map(([cx, cy]) => svg("circle", { class: "chart-point", cx, cy, r: 3 })));
}

function objectiveCard(route, obj, window, index, asOf) {
  const status = obj.status || "no_data";
  const name = METRIC_NAMES[obj.metric] || obj.metric;
  return h("li", { class: "objective", "data-metric": obj.metric, "data-type": obj.type },
    h("div", { class: "objective-head" },
      h("span", { class: "objective-name", text: name + " " + targetText(obj) }),
      h("span", { class: "badge status-badge status-" + status, text: STATUS_LABELS[status] || status })),
    h("p", { class: "objective-figures" },
      h("span", { text: "Observed " + (obj.estimated ? "≈ " : "") + figure(obj.observed, obj.metric) }),
      h("span", { class: "objective-budget", text: budgetText(obj.budgetRemaining) })),
    ...objectiveNotes(obj).map((text) => h("p", { class: "hint objective-note", text })),
    chart(route, obj, window, index, asOf));
}

// " (context 0–4096)" for a context-length range; nothing for a whole metric.
export function rangeText(range) {
  if (!range || typeof range !== "object") return "";
  const low = range.contextLengthRangeLow ?? 0;
  const high = range.contextLengthRangeHigh;
  return " (context " + low + (high === null || high === undefined ? "+" : "–" + high) + ")";
}

// What is said of the figures: always their time; why, when they are stale or unavailable.
export function sourceText(source) {
  if (!source) return "";
  if (source.status === "not_configured") return "Not measured: slo-api is not connected to a Prometheus.";
  if (source.status === "ok") return "Figures as of " + source.asOf + ".";
  const why = "(" + (source.reason || "no reason given") + ")";
  if (source.status === "stale") return "Figures stale " + why + "; as of " + (source.asOf || "never") + ".";
  const since = source.asOf ? "; figures as of " + source.asOf : "; no figures yet";
  return "Prometheus unavailable " + why + since + ".";
}

function sourceNote(source) {
  if (!source) return null;
  const plain = source.status === "ok" || source.status === "not_configured";
  return h("p", { class: plain ? "hint attainment-as-of" : "hint attainment-stale", text: sourceText(source) });
}

function windowPicker(route) {
  const select = h("select", { id: "attainment-window", onchange: (e) => {
    shownWindow = e.target.value;
    showAttainment(route);
  } }, WINDOWS.map((w) => h("option", { value: w, selected: w === shownWindow ? "" : null, text: w })));
  select.value = shownWindow;
  return h("div", { class: "filter attainment-window" }, h("label", { for: "attainment-window", text: "Window" }), select);
}

export async function showAttainment(route) {
  const box = $("attainment-body");
  if (!box) return;
  const window = shownWindow;
  const path = "routes/" + encodeURIComponent(route) + "/attainment?window=" + window;
  const result = await api("GET", path);
  if (route !== state.selected || window !== shownWindow) return;
  if (!result.ok) {
    box.replaceChildren(h("p", { class: "hint", text: "Attainment unavailable: " + describe(result.error) }));
    return;
  }
  const data = result.data || {};
  const objectives = data.objectives || [];
  const gaps = (data.unmeasured || []).map((u) => h("li", {
    text: (METRIC_NAMES[u.metric] || u.metric) + rangeText(u.range) + ": " + (u.reason || "not measurable") }));
  // replaceChildren writes a null as the text "null": only the parts there are.
  box.replaceChildren(...[
    windowPicker(route),
    sourceNote(data.source),
    objectives.length
      ? h("ul", { class: "objectives" }, objectives.map((o, i) =>
          objectiveCard(route, o, data.window || window, i, data.source && data.source.asOf)))
      : (data.source && data.source.status === "ok" ? h("p", { class: "hint", text: "No objectives to measure." }) : null),
    gaps.length ? h("div", { class: "unmeasured" },
      h("p", { class: "hint", text: "Not measured:" }), h("ul", {}, gaps)) : null,
  ].filter(Boolean));
}

export function clearAttainment() {
  const box = $("attainment-body");
  if (box) box.replaceChildren();
}
