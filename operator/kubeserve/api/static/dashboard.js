// kubeserve dashboard: polls the admin API and draws what runs. Plain script, no build step.
//
// Data comes only from fetches this script makes with the token the user typed (kept in this
// tab's sessionStorage, sent as "Authorization: Bearer"); the page and this file hold none.
// Every value from the server is written with textContent, never parsed as HTML: application
// names and messages are the deployers' text. Rates and latency are computed from two readings
// of GET /metrics (Prometheus text, Ray Serve's metric names); without that endpoint the page
// says so and shows no numbers.
//
// The page at /namespaces/<namespace>/ shows that namespace's instance: every path it fetches is
// prefixed the same way. The namespace picker lists the namespaces the server says the caller
// may read (GET /api/kubeserve/namespaces) and moves to the chosen one's page.
"use strict";

const POLL_MS = 1500;
const METRICS_RETRY_MS = 15000;
const MAX_EVENTS = 100;
const TOKEN_KEY = "kubeserve.token";
const APPLICATIONS_PATH = "/api/serve/applications/";
const METRICS_PATH = "/metrics";
const NAMESPACES_PATH = "/api/kubeserve/namespaces";
// "/namespaces/team-a" on that namespace's page, "" on the page of the server's own.
const BASE = (location.pathname.match(/^\/namespaces\/[^/]+/) || [""])[0];

const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------------------- talking to it

class AuthRequired extends Error {}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function get(path) {
  const headers = {};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  const response = await fetch(BASE + path, { headers, cache: "no-store", credentials: "omit" });
  if (response.status === 401 || response.status === 403) {
    let message = response.status === 401 ? "a token is required" : "the token was refused";
    try {
      message = (await response.json()).error || message;
    } catch (_) { /* keep the generic message */ }
    throw new AuthRequired(message);
  }
  return response;
}

// --------------------------------------------------------------------------------- formatting

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  return node;
}

function badge(state) {
  return el("span", state, { class: "badge", "data-state": state });
}

function row(cells, attrs) {
  const tr = el("tr", null, attrs);
  for (const cell of cells) {
    if (cell instanceof Node) {
      const td = el("td");
      td.append(cell);
      tr.append(td);
    } else if (cell && typeof cell === "object") {
      tr.append(el("td", cell.text, { class: cell.class || "" }));
    } else {
      tr.append(el("td", cell));
    }
  }
  return tr;
}

function fill(tableId, rows) {
  $(tableId).tBodies[0].replaceChildren(...rows);
}

function clock(seconds) {
  if (!seconds) return "";
  return new Date(seconds * 1000).toLocaleString();
}

function number(value, digits) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  return value.toFixed(digits);
}

// -------------------------------------------------------------------------------- the tables

function replicasOf(app) {
  const out = [];
  for (const [depName, dep] of Object.entries(app.deployments || {})) {
    for (const replica of dep.replicas || []) out.push([depName, replica]);
  }
  return out;
}

function render(details) {
  const apps = Object.values(details.applications || {}).sort((a, b) =>
    a.name.localeCompare(b.name));
  $("no-apps").hidden = apps.length > 0;
  fill("applications", apps.map((app) => row(
    [app.name, badge(app.status), { text: app.route_prefix ?? "(no route)", class: "path" },
      clock(app.last_deployed_time_s), app.message],
    { "data-app": app.name, "data-status": app.status })));

  const deployments = [];
  const replicas = [];
  for (const app of apps) {
    for (const [name, dep] of Object.entries(app.deployments || {})) {
      const running = (dep.replicas || []).filter((r) => r.state === "RUNNING").length;
      deployments.push(row(
        [app.name, name, badge(dep.status),
          `${running} / ${dep.target_num_replicas}`, dep.message],
        { "data-app": app.name, "data-deployment": name, "data-status": dep.status,
          "data-running": String(running) }));
    }
    for (const [depName, r] of replicasOf(app)) {
      replicas.push(row(
        [app.name, depName, { text: r.replica_id, class: "path" }, badge(r.state),
          { text: r.pid ?? "", class: "num" }, r.node_ip || r.node_id || "",
          clock(r.start_time_s), { text: r.log_file_path || "", class: "path" }],
        { "data-replica": r.replica_id, "data-state": r.state, "data-pid": String(r.pid ?? ""),
          "data-app": app.name, "data-deployment": depName }));
    }
  }
  fill("deployments", deployments);
  fill("replicas", replicas);

  const proxies = Object.entries(details.proxies || {}).sort();
  fill("proxies", proxies.map(([node, p]) => row(
    [p.node_ip || node, badge(p.status), { text: p.worker_id || "", class: "num" },
      { text: p.log_file_path || "", class: "path" }],
    { "data-proxy": node, "data-status": p.status })));
}

// ------------------------------------------------------------------------- recent events
// Derived here from successive snapshots: the status of each object, keyed by what it is (a
// replica by its id: its pid may be set later); the label says it as a user reads it.

let previous = null;
const events = [];

function statuses(details) {
  const out = new Map();
  const add = (key, label, status) => out.set(key, { label, status });
  for (const app of Object.values(details.applications || {})) {
    add(`a ${app.name}`, `application ${app.name}`, app.status);
    for (const [name, dep] of Object.entries(app.deployments || {})) {
      const path = `${app.name}/${name}`;
      add(`d ${path}`, `deployment ${path}`, dep.status);
      for (const r of dep.replicas || []) {
        const pid = r.pid ? ` (pid ${r.pid})` : "";
        add(`r ${path}/${r.replica_id}`, `replica ${path}/${r.replica_id}${pid}`, r.state);
      }
    }
  }
  for (const [node, proxy] of Object.entries(details.proxies || {})) {
    add(`p ${node}`, `proxy ${proxy.node_ip || node}`, proxy.status);
  }
  return out;
}

function transitions(before, after) {
  const out = [];
  for (const [key, now] of after) {
    const old = before.get(key);
    if (old === undefined) out.push(`${now.label}: ${now.status}`);
    else if (old.status !== now.status) out.push(`${now.label}: ${old.status} → ${now.status}`);
  }
  for (const [key, old] of before) {
    if (!after.has(key)) out.push(`${old.label}: ${old.status} → gone`);
  }
  return out;
}

function record(details) {
  const now = statuses(details);
  const changes = previous === null
    ? [`page opened: ${Object.keys(details.applications || {}).length} application(s)`]
    : transitions(previous, now);
  previous = now;
  const at = new Date();
  for (const text of changes) events.unshift({ at, text });
  events.length = Math.min(events.length, MAX_EVENTS);
  if (changes.length) {
    $("events").replaceChildren(...events.map((e) => {
      const li = el("li");
      li.append(el("time", e.at.toLocaleTimeString(), { datetime: e.at.toISOString() }),
        document.createTextNode(e.text));
      return li;
    }));
  }
}

// ---------------------------------------------------------------------------------- metrics
// Prometheus text exposition; Ray Serve's names, with or without the "_total" of counters.

const REQUESTS = "ray_serve_num_http_requests";
const ERRORS = "ray_serve_num_http_error_requests";
const LATENCY = "ray_serve_http_request_latency_ms";

function parseLabels(text) {
  const labels = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  let m;
  while ((m = re.exec(text)) !== null) {
    labels[m[1]] = m[2].replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
  }
  return labels;
}

function parsePrometheus(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    samples.push({ name: m[1], labels: parseLabels(m[3] || ""), value: parseFloat(m[4]) });
  }
  return samples;
}

// Per (application, route): cumulative requests, errors, latency sum, count and buckets.
function routeTotals(samples) {
  const totals = new Map();
  const entry = (labels) => {
    const key = JSON.stringify([labels.application || "", labels.route || ""]);
    if (!totals.has(key)) {
      totals.set(key, { application: labels.application || "", route: labels.route || "",
        requests: 0, errors: 0, sum: 0, count: 0, buckets: new Map() });
    }
    return totals.get(key);
  };
  for (const s of samples) {
    if (s.name === REQUESTS || s.name === REQUESTS + "_total") entry(s.labels).requests += s.value;
    else if (s.name === ERRORS || s.name === ERRORS + "_total") entry(s.labels).errors += s.value;
    else if (s.name === LATENCY + "_sum") entry(s.labels).sum += s.value;
    else if (s.name === LATENCY + "_count") entry(s.labels).count += s.value;
    else if (s.name === LATENCY + "_bucket") {
      const buckets = entry(s.labels).buckets;
      const le = parseFloat(s.labels.le);
      buckets.set(le, (buckets.get(le) || 0) + s.value);
    }
  }
  return totals;
}

// The q-quantile of cumulative histogram buckets (le -> count), interpolated as Prometheus'
// histogram_quantile does; null without observations.
function quantile(q, buckets) {
  const bounds = [...buckets.keys()].sort((a, b) => a - b);
  if (!bounds.length) return null;
  const total = buckets.get(bounds[bounds.length - 1]);
  if (!(total > 0)) return null;
  const rank = q * total;
  let lowerBound = 0;
  let lowerCount = 0;
  for (const bound of bounds) {
    const count = buckets.get(bound);
    if (count >= rank) {
      if (bound === Infinity) return lowerBound;
      const width = count - lowerCount;
      return width > 0 ? lowerBound + (bound - lowerBound) * (rank - lowerCount) / width : bound;
    }
    lowerBound = bound;
    lowerCount = count;
  }
  return lowerBound;
}

function delta(now, before) {
  return before === undefined || now < before ? now : now - before;  // a reset starts again
}

let lastReading = null;  // { at: ms, totals }
let metricsRetryAt = 0;

function metricsUnavailable(why) {
  metricsRetryAt = Date.now() + METRICS_RETRY_MS;  // asked again now and then, not every poll
  lastReading = null;
  $("metrics").hidden = true;
  $("metrics-status").hidden = false;
  $("metrics-status").textContent = why;
}

async function refreshMetrics() {
  if (Date.now() < metricsRetryAt) return;
  let response;
  try {
    response = await get(METRICS_PATH);
  } catch (err) {
    const why = err instanceof AuthRequired ? ` (${err.message})` : "";
    metricsUnavailable("metrics not available" + why);
    return;
  }
  if (!response.ok) {
    metricsUnavailable(`metrics not available (GET ${METRICS_PATH}: ${response.status})`);
    return;
  }
  const reading = { at: Date.now(), totals: routeTotals(parsePrometheus(await response.text())) };
  const before = lastReading;
  lastReading = reading;
  const rows = [];
  for (const [key, t] of [...reading.totals].sort()) {
    const old = before && before.totals.get(key);
    const seconds = before ? (reading.at - before.at) / 1000 : 0;
    const rate = (now, then) => (before && seconds > 0 ? delta(now, then) / seconds : null);
    const n = old ? delta(t.count, old.count) : 0;
    const window = new Map([...t.buckets].map(([le, c]) => [le, delta(c, old?.buckets.get(le))]));
    rows.push(row(
      [t.application, { text: t.route, class: "path" },
        { text: number(rate(t.requests, old?.requests), 2), class: "num" },
        { text: number(rate(t.errors, old?.errors), 2), class: "num" },
        { text: n > 0 ? number(delta(t.sum, old.sum) / n, 1) + " ms" : "–", class: "num" },
        { text: n > 0 ? number(quantile(0.95, window), 1) + " ms" : "–", class: "num" },
        { text: number(t.requests, 0), class: "num" }],
      { "data-metrics-app": t.application, "data-route": t.route }));
  }
  $("metrics-status").hidden = rows.length > 0;
  $("metrics-status").textContent = "no requests recorded yet";
  $("metrics").hidden = rows.length === 0;
  fill("metrics", rows);
}

// ------------------------------------------------------------------------------ namespaces

let namespacesShown = false;

async function showNamespaces() {
  if (namespacesShown) return;
  const response = await get(NAMESPACES_PATH);
  if (!response.ok) return;  // a server without namespaces: no picker
  const { own, namespaces } = await response.json();
  namespacesShown = true;
  const current = BASE ? decodeURIComponent(BASE.slice("/namespaces/".length)) : own;
  const names = namespaces.includes(current) ? namespaces : [current, ...namespaces];
  const select = $("namespace");
  select.replaceChildren(...names.map((name) => {
    const option = el("option", name, { value: name });
    option.selected = name === current;
    return option;
  }));
  $("namespace-picker").hidden = names.length < 2;
  select.addEventListener("change", () => {
    const name = select.value;
    location.assign(name === own ? "/" : `/namespaces/${encodeURIComponent(name)}/`);
  });
}

// ------------------------------------------------------------------------------ the loop

function showLogin(message) {
  $("content").hidden = true;
  $("login").hidden = false;
  $("sign-out").hidden = true;
  $("login-error").textContent = message || "";
  setConnection("signed out");
  $("token").focus();
}

function setConnection(state) {
  $("connection").textContent = state;
  $("connection").dataset.state = state;
}

// One polling loop at a time: restart() begins a new one, and a reading that comes back to a
// loop that is no longer current (the token was just forgotten or replaced) is dropped.
let timer = null;
let generation = 0;

async function tick(loop) {
  try {
    const response = await get(APPLICATIONS_PATH);
    const body = await response.json();
    if (loop !== generation) return;
    if (!response.ok) throw new Error(body.error || `GET ${APPLICATIONS_PATH}: ${response.status}`);
    $("login").hidden = true;
    $("content").hidden = false;
    $("sign-out").hidden = !token();
    $("error").hidden = true;
    render(body);
    record(body);
    await showNamespaces();
    await refreshMetrics();
    setConnection("connected");
    const at = new Date();
    $("updated").textContent = "updated " + at.toLocaleTimeString();
    $("updated").dataset.at = String(at.getTime());
  } catch (err) {
    if (loop !== generation) return;
    if (err instanceof AuthRequired) {
      const refused = token();
      sessionStorage.removeItem(TOKEN_KEY);  // a reload must not send it again
      showLogin(refused ? err.message : "");
      return;  // polling resumes when a token is entered
    }
    setConnection("disconnected");
    $("login").hidden = true;
    $("content").hidden = false;  // the reason shows even when nothing was ever read
    $("error").hidden = false;
    $("error").textContent = `cannot read ${APPLICATIONS_PATH}: ${err.message}`;
  }
  if (loop === generation) timer = setTimeout(tick, POLL_MS, loop);
}

function restart() {
  generation += 1;
  clearTimeout(timer);
  timer = setTimeout(tick, 0, generation);
}

function start() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("token").value = "";
    $("login-error").textContent = "";
    restart();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    restart();
  });
  restart();
}

start();
