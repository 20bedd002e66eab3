// What the API accepts and answers, read from its OpenAPI document (openapi.json) rather than
// restated here: the choices of the form's selects, the values a reset sets, and which fields
// of a body make its summary. Each body schema names its kind (`x-kind`) and what DELETE resets
// it to (`x-reset`, in the API's fields); the Summary schema each kind's fields (`x-summary`).

import { api } from "./api.js";

let doc = null;
let loading = null;

// Reads the document once; a failure is tried again at the next call.
export function loadSchema() {
  if (doc) return Promise.resolve({ ok: true });
  if (!loading) {
    loading = api("GET", "openapi.json").then((result) => {
      loading = null;
      if (result.ok && result.data && result.data.components) doc = result.data;
      return result;
    });
  }
  return loading;
}

function named(name) {
  return doc.components.schemas[name];
}

// A property's schema, through `$ref` and the `anyOf` of an optional field.
function resolve(schema) {
  let s = schema;
  for (;;) {
    if (s.$ref) s = named(s.$ref.split("/").pop());
    else if (s.anyOf) s = s.anyOf.find((option) => option.type !== "null");
    else return s;
  }
}

function choices(schema) {
  const s = resolve(schema);
  return s.enum ? [...s.enum] : [s.const];
}

function bodyOf(kind) {
  return Object.values(doc.components.schemas).find((s) => s["x-kind"] === kind);
}

function property(kind, ...path) {
  let s = bodyOf(kind);
  for (const name of path) s = resolve(s.properties[name]);
  return s;
}

// The bound types a kind's minimum and maximum may have, and the one a bound without a type has.
export function boundTypes(kind) {
  const min = property(kind, "minimumDeployment");
  return {
    min: choices(min.properties.type),
    max: choices(property(kind, "maximumDeployment").properties.type),
    fallback: min.properties.type.default,
  };
}

export function metricTypes() {
  return choices(named("Metric").properties.type);
}

export function swapPolicies() {
  return choices(property("pool", "pool").properties.swapPolicy);
}

// What DELETE sets, in the API's fields (a pool's under `pool`).
export function resetValues(kind) {
  return bodyOf(kind)["x-reset"];
}

// A summary's fields for a kind, each with where it stands in the route's body (dotted).
export function summaryFields(kind) {
  return named("Summary")["x-summary"][kind] || null;
}
