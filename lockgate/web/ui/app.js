// Lockgate dashboard: plain JS, no dependencies. Reads the REST API of the
// driver that serves it, polling once a second. The token comes from the URL
// fragment (#token=...), which browsers never send, and goes in the
// Authorization header of every request.
"use strict";

const POLL_MS = 1000;
const KEEP = 300; // points of the client-side rate history
const SVGNS = "http://www.w3.org/2000/svg";
const state = { token: "", job: null, timer: null, rates: {}, busy: false };

function params() {
  const p = new URLSearchParams(location.hash.replace(/^#/, ""));
  return { token: p.get("token") || "", job: p.get("job") };
}

function link(job) {
  const p = new URLSearchParams();
  p.set("token", state.token);
  if (job) p.set("job", job);
  return "#" + p.toString();
}

function esc(v) {
  return String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + state.token },
                                cache: "no-store" });
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { msg = (await r.json()).errors.join("; "); } catch (e) { /* not JSON */ }
    const err = new Error(msg); err.status = r.status; throw err;
  }
  return r.json();
}

// ------------------------------------------------------------- formatting
function num(n) {
  if (n === null || n === undefined) return "–";
  return Math.round(n).toLocaleString("en-US");
}
function rate(n) {
  if (n === null || n === undefined) return "–";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + " M/s";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + " k/s";
  return n.toFixed(0) + " /s";
}
function dur(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(2) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function bytes(b) {
  if (b === null || b === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : Math.round(b)) + " " + u[i];
}
function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "–"; }
function wm(ms) { return ms === null || ms === undefined ? "–" : new Date(ms).toISOString().replace("T", " ").replace("Z", ""); }
function pct(x) { return (x / 10).toFixed(0) + "%"; }

function card(k, v, id) {
  return `<div class="card"${id ? ` id="${id}"` : ""}><div class="v">${v}</div><div class="k">${esc(k)}</div></div>`;
}

// colour of a vertex by its share of time: idle blue, busy red, backpressured grey (as Flink's)
function color(v) {
  const busy = (v.busy_ms_per_second || 0) / 1000, bp = (v.backpressured_ms_per_second || 0) / 1000;
  if (bp > busy && bp > 0.1) {
    const g = Math.round(170 - 120 * Math.min(1, bp));
    return `rgb(${g},${g},${g})`;
  }
  const r = Math.round(80 + 175 * busy), g = Math.round(140 - 90 * busy), b = Math.round(220 - 170 * busy);
  return `rgb(${r},${g},${b})`;
}

// ----------------------------------------------------------------- jobs page
async function jobsPage() {
  document.getElementById("crumb").textContent = "jobs";
  const jobs = (await api("/jobs")).jobs;
  const rows = [];
  for (const j of jobs) {
    let m = null;
    try { m = (await api(`/jobs/${encodeURIComponent(j.id)}/metrics`)).job; } catch (e) { /* ended */ }
    rows.push(`<tr><td><a href="${esc(link(j.id))}">${esc(j.id)}</a></td><td>${esc(j.name)}</td>
      <td class="status-${esc(j.status)}">${esc(j.status)}</td><td>${esc(j.guarantee || "–")}</td>
      <td class="n">${m ? dur(m.uptime) : "–"}</td><td class="n">${m ? num(m.records_read) : "–"}</td>
      <td class="n">${m ? num(m.records_written) : "–"}</td><td class="n">${m ? num(m.restarts) : "–"}</td></tr>`);
  }
  document.getElementById("main").innerHTML = `<h2>Jobs</h2>
    <table id="jobs"><thead><tr><th>job</th><th>name</th><th>status</th><th>guarantee</th>
    <th class="n">uptime</th><th class="n">records in</th><th class="n">records out</th><th class="n">restarts</th></tr></thead>
    <tbody>${rows.join("") || '<tr><td colspan="8" class="muted">no job is served here</td></tr>'}</tbody></table>`;
}

// ------------------------------------------------------------------ job page
function layout(vertices) {
  // columns by the longest path from a source
  const level = {};
  const byId = {};
  for (const v of vertices) { byId[v.id] = v; level[v.id] = 0; }
  for (let pass = 0; pass < vertices.length; pass++) {
    for (const v of vertices) for (const e of v.outputs) level[e.to] = Math.max(level[e.to], level[v.id] + 1);
  }
  const cols = {};
  for (const v of vertices) (cols[level[v.id]] = cols[level[v.id]] || []).push(v);
  const W = 230, H = 92, GX = 90, GY = 26, pos = {};
  let height = 0;
  for (const [c, vs] of Object.entries(cols)) {
    vs.forEach((v, i) => { pos[v.id] = { x: 10 + c * (W + GX), y: 10 + i * (H + GY) }; });
    height = Math.max(height, 10 + vs.length * (H + GY));
  }
  const width = 10 + Object.keys(cols).length * (W + GX);
  return { pos, W, H, width, height };
}

function el(name, attrs, text) {
  const e = document.createElementNS(SVGNS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawGraph(vertices) {
  const { pos, W, H, width, height } = layout(vertices);
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, id: "graph-svg" });
  const defs = el("defs");
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.appendChild(el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#66707c" }));
  defs.appendChild(marker); svg.appendChild(defs);
  for (const v of vertices) {
    for (const e of v.outputs) {
      const a = pos[v.id], b = pos[e.to];
      if (!a || !b) continue;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      svg.appendChild(el("path", { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, fill: "none",
        stroke: "#66707c", "stroke-width": 1.5, "marker-end": "url(#arrow)", class: "edge" }));
      svg.appendChild(el("text", { x: mx, y: (y1 + y2) / 2 - 5, "text-anchor": "middle", fill: "#4a535e", class: "edge-label" },
        e.partitioning.toUpperCase() + (e.tag ? ` [${e.tag}]` : "")));
    }
  }
  for (const v of vertices) {
    const p = pos[v.id];
    const g = el("g", { class: "vertex", "data-vertex": v.id, "data-records-in": v.records_in,
      "data-busy": Math.round(v.busy_ms_per_second), transform: `translate(${p.x},${p.y})` });
    g.appendChild(el("title", {}, v.operators.map((o) => `${o.uid} (${o.kind})`).join(" -> ")));
    g.appendChild(el("rect", { width: W, height: H, rx: 6, fill: color(v), stroke: "#1d2430", "stroke-width": 1 }));
    const name = v.operators.map((o) => o.uid).join(" → ");
    g.appendChild(el("text", { x: 10, y: 19, fill: "#fff", "font-weight": 600 }, name.length > 30 ? name.slice(0, 29) + "…" : name));
    g.appendChild(el("text", { x: 10, y: 37, fill: "#fff" }, `parallelism ${v.parallelism} · ${v.operators.length} operator${v.operators.length > 1 ? "s" : ""}`));
    g.appendChild(el("text", { x: 10, y: 55, fill: "#fff" }, `in ${rate(v.records_in_per_second)} · out ${rate(v.records_out_per_second)}`));
    g.appendChild(el("text", { x: 10, y: 73, fill: "#fff" },
      `busy ${pct(v.busy_ms_per_second)} · backpr. ${pct(v.backpressured_ms_per_second)} · idle ${pct(v.idle_ms_per_second)}`));
    svg.appendChild(g);
  }
  return svg;
}

// a line plot: series = [{name, color, points: [[x, y]...]}]
function linePlot(id, series, fmtY, fmtX) {
  const w = 640, h = 200, L = 64, R = 12, T = 10, B = 26;
  const svg = el("svg", { width: "100%", viewBox: `0 0 ${w} ${h}`, id, preserveAspectRatio: "none" });
  const pts = series.flatMap((s) => s.points);
  if (!pts.length) { svg.appendChild(el("text", { x: w / 2, y: h / 2, "text-anchor": "middle", fill: "#6b7480" }, "no data yet")); return svg; }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  if (x1 === x0) x1 = x0 + 1;
  const y1 = Math.max(...pts.map((p) => p[1]), 1e-9) * 1.1;
  const X = (x) => L + (x - x0) / (x1 - x0) * (w - L - R), Y = (y) => h - B - y / y1 * (h - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = y1 * i / 4;
    svg.appendChild(el("line", { x1: L, x2: w - R, y1: Y(y), y2: Y(y), stroke: "#e4e8ee" }));
    svg.appendChild(el("text", { x: L - 6, y: Y(y) + 4, "text-anchor": "end", fill: "#6b7480" }, fmtY(y)));
  }
  svg.appendChild(el("text", { x: L, y: h - 6, fill: "#6b7480" }, fmtX(x0)));
  svg.appendChild(el("text", { x: w - R, y: h - 6, "text-anchor": "end", fill: "#6b7480" }, fmtX(x1)));
  for (const s of series) {
    if (!s.points.length) continue;
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    svg.appendChild(el("path", { d, fill: "none", stroke: s.color, "stroke-width": 2, class: "series", "data-series": s.name, "data-points": s.points.length }));
    if (s.dots) for (const p of s.points) svg.appendChild(el("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, fill: s.color, class: "dot" }));
  }
  return svg;
}

function legend(items) {
  return `<div class="legend">${items.map(([n, c]) => `<span><i style="background:${c}"></i>${esc(n)}</span>`).join("")}</div>`;
}

function rememberRates(job, m) {
  const h = state.rates[job] = state.rates[job] || [];
  const t = Date.now() / 1000;
  const sources = m.vertices.filter((v) => v.source);
  const sinks = m.vertices.filter((v) => !v.outputs.length);
  h.push([t, sources.reduce((a, v) => a + v.records_out_per_second, 0), sinks.reduce((a, v) => a + v.records_in_per_second, 0)]);
  if (h.length > KEEP) h.shift();
  return h;
}

async function jobPage(job) {
  const id = encodeURIComponent(job);
  const [m, c] = await Promise.all([api(`/jobs/${id}/metrics`), api(`/jobs/${id}/checkpoints`)]);
  const j = m.job, k = m.checkpoints;
  document.getElementById("crumb").textContent = `${j.name} · ${j.job_id}`;
  const hist = rememberRates(job, m);
  const progress = j.size_hint ? Math.min(1, j.records_read / Math.max(1, j.size_hint)) : null;
  const last = k.last;
  const main = document.getElementById("main");
  main.innerHTML = `
    <div class="cards">
      ${card("status", `<span class="status-${esc(j.status)}">${esc(j.status)}</span>`, "job-status")}
      ${card("guarantee", esc(j.guarantee || "–"))}
      ${card("uptime", dur(j.uptime))}
      ${card("records in (sources)", num(j.records_read), "records-in")}
      ${card("records out (sinks)", num(j.records_written), "records-out")}
      ${card("read rate", rate(j.records_in_per_second))}
      ${card("checkpoints", `<span id="checkpoint-count">${num(k.completed)}</span>` + (k.failed ? ` <span class="error">(${num(k.failed)} failed)</span>` : ""))}
      ${card("last checkpoint", last ? `#${last.id} · ${dur(last.end_to_end)} · ${bytes(last.bytes)}` : "–")}
      ${card("last checkpoint age", dur(k.last_age))}
      ${card("restarts", num(j.restarts), "restart-count")}
      ${progress !== null ? card("progress", `${(progress * 100).toFixed(1)}% <span class="bar" style="width:${Math.round(progress * 80)}px"></span>`) : ""}
    </div>
    <h2>Job graph</h2>
    <div class="panel" id="graph"></div>
    ${legend([["idle", color({ busy_ms_per_second: 0 })], ["busy", color({ busy_ms_per_second: 1000 })], ["backpressured", color({ backpressured_ms_per_second: 900 })]])}
    <h2>Tasks</h2>
    <table id="tasks"><thead><tr><th>vertex / subtask</th><th class="n">records in</th><th class="n">in /s</th>
      <th class="n">records out</th><th class="n">out /s</th><th class="n">busy</th><th class="n">backpressured</th><th class="n">idle</th>
      <th class="n">queue fill</th><th>watermark</th><th class="n">state keys</th><th class="n">state (last ack)</th></tr></thead>
      <tbody>${m.vertices.map(taskRows).join("")}</tbody></table>
    ${autoscalerSection(m.autoscaler)}
    <h2>Plots</h2>
    <div class="plots">
      <div class="panel"><div class="plot-title">records per second (sources read, sinks received)</div><div id="plot-rate"></div>
        ${legend([["read", "#2d6cdf"], ["into sinks", "#e07b39"]])}</div>
      <div class="panel"><div class="plot-title">checkpoint duration by id (end to end, synchronous, alignment)</div><div id="plot-checkpoints"></div>
        ${legend([["end to end", "#2d6cdf"], ["synchronous", "#2f8f4e"], ["alignment", "#c0392b"]])}</div>
      <div class="panel"><div class="plot-title">checkpoint size by id</div><div id="plot-size"></div></div>
    </div>
    <h2>Checkpoints <span class="muted">(${num(k.completed)} completed, ${num(k.failed)} failed, ${num(k.in_progress)} in progress)</span></h2>
    <table id="checkpoints"><thead><tr><th class="n">id</th><th>trigger</th><th>status</th><th>triggered</th>
      <th class="n">end to end</th><th class="n">synchronous</th><th class="n">asynchronous</th><th class="n">alignment</th><th class="n">size</th><th class="n">in flight</th><th>failure / decline reason</th></tr></thead>
      <tbody>${c.history.slice().reverse().slice(0, 50).map((h) => `<tr class="checkpoint" data-id="${h.id}">
        <td class="n">${h.id}</td><td>${esc(h.trigger || h.kind)}</td><td class="status-${esc(h.status)}">${esc(h.status)}</td>
        <td>${when(h.trigger_time)}</td><td class="n">${dur(h.end_to_end)}</td><td class="n">${dur(h.sync_duration)}</td>
        <td class="n">${dur(h.async_duration)}</td><td class="n">${dur(h.alignment)}</td>
        <td class="n">${h.status === "completed" ? bytes(h.bytes) : "–"}</td>
        <td class="n">${h.in_flight ? bytes(h.in_flight) : "–"}</td><td class="reason">${esc(h.failure || "")}</td></tr>`).join("")
        || '<tr><td colspan="11" class="muted">no checkpoint yet</td></tr>'}</tbody></table>
    <h2>Restarts</h2>
    <table id="restarts"><thead><tr><th>time</th><th class="n">attempt</th><th>failing operator (task)</th><th>cause</th></tr></thead>
      <tbody>${m.restarts.slice().reverse().map((r) => `<tr><td>${when(r.time)}</td><td class="n">${r.attempt}</td>
        <td>${esc(r.operator || "–")}</td><td class="reason">${esc(r.cause)}</td></tr>`).join("")
        || '<tr><td colspan="4" class="muted">none</td></tr>'}</tbody></table>
    <h2>Savepoints</h2>
    <table id="savepoints"><thead><tr><th class="n">id</th><th>time</th><th>status</th><th>location / failure</th></tr></thead>
      <tbody>${m.savepoints.slice().reverse().map((s) => `<tr><td class="n">${s.id}</td><td>${when(s.time)}</td>
        <td class="status-${esc(s.status)}">${esc(s.status)}</td><td class="reason">${esc(s.path || s.failure || "")}</td></tr>`).join("")
        || '<tr><td colspan="4" class="muted">none taken</td></tr>'}</tbody></table>`;
  document.getElementById("graph").appendChild(drawGraph(m.vertices));
  const t0 = hist.length ? hist[0][0] : 0;
  document.getElementById("plot-rate").appendChild(linePlot("rate-svg", [
    { name: "read", color: "#2d6cdf", points: hist.map((p) => [p[0] - t0, p[1]]) },
    { name: "sinks", color: "#e07b39", points: hist.map((p) => [p[0] - t0, p[2]]) }],
    rate, (x) => `${x.toFixed(0)} s`));
  const done = c.history.filter((h) => h.status === "completed");
  document.getElementById("plot-checkpoints").appendChild(linePlot("checkpoints-svg", [
    { name: "end_to_end", color: "#2d6cdf", dots: true, points: done.map((h) => [h.id, h.end_to_end || 0]) },
    { name: "sync", color: "#2f8f4e", dots: true, points: done.map((h) => [h.id, h.sync_duration || 0]) },
    { name: "alignment", color: "#c0392b", dots: true, points: done.map((h) => [h.id, h.alignment || 0]) }],
    dur, (x) => `#${x.toFixed(0)}`));
  document.getElementById("plot-size").appendChild(linePlot("size-svg", [
    { name: "size", color: "#7b52ab", dots: true, points: done.map((h) => [h.id, h.bytes || 0]) }],
    bytes, (x) => `#${x.toFixed(0)}`));
}

function ratio(x) { return x === null || x === undefined ? "–" : x.toFixed(2); }

// the autoscaler: its state, each vertex's latest evaluation, a row per decision
function autoscalerSection(a) {
  if (!a || !a.enabled) return "";
  const c = a.config;
  const band = `${(c.target_utilization - c.utilization_boundary).toFixed(2)}..${(c.target_utilization + c.utilization_boundary).toFixed(2)}`;
  return `<h2>Autoscaler <span class="muted" id="autoscaler-state">${esc(a.state)}</span></h2>
    <p class="muted">parallelism ${esc(c.min)}..${esc(c.max === null ? "max_parallelism" : c.max)} · target utilization ${esc(c.target_utilization)} (acts outside ${band})
      · stabilization ${dur(c.stabilization)} · window ${dur(c.window)} · cool-down ${dur(c.cooldown)} · ${num(a.decision_count)} decision${a.decision_count === 1 ? "" : "s"}</p>
    <table id="autoscaler-vertices"><thead><tr><th>vertex</th><th class="n">parallelism</th><th class="n">wants</th><th class="n">input</th>
      <th class="n">processed</th><th class="n">true rate / subtask</th><th class="n">busy</th><th class="n">utilization</th><th class="n">backlog</th><th>evaluation</th></tr></thead>
      <tbody>${a.vertices.map((v) => `<tr class="evaluation" data-vertex="${esc(v.vertex)}"><td>${esc(v.vertex)}</td>
        <td class="n">${v.parallelism}</td><td class="n">${v.proposed}</td><td class="n">${rate(v.input_rate)}</td>
        <td class="n">${rate(v.processing_rate)}</td><td class="n">${rate(v.true_rate)}</td><td class="n">${pct((v.busy || 0) * 1000)}</td>
        <td class="n">${ratio(v.utilization)}</td><td class="n">${num(v.backlog)}</td><td class="reason">${esc(v.reason)}</td></tr>`).join("")
        || '<tr><td colspan="10" class="muted">no evaluation yet</td></tr>'}</tbody></table>
    <table id="autoscaler-decisions"><thead><tr><th>time</th><th>vertex</th><th class="n">from</th><th class="n">to</th><th>why</th><th>outcome</th></tr></thead>
      <tbody>${a.decisions.slice().reverse().map((d) => `<tr class="decision" data-vertex="${esc(d.vertex)}" data-from="${d.from}" data-to="${d.to}">
        <td>${when(d.time)}</td><td>${esc(d.vertex)}</td><td class="n">${d.from}</td><td class="n">${d.to}</td>
        <td class="reason">${esc(d.why)}</td><td class="${d.status === "done" ? "status-completed" : d.status === "requested" ? "status-in_progress" : "status-failed"}">${esc(d.status)}${d.seconds !== null && d.seconds !== undefined ? " · " + dur(d.seconds) : ""}</td></tr>`).join("")
        || '<tr><td colspan="6" class="muted">no decision yet</td></tr>'}</tbody></table>`;
}

function taskRows(v) {
  const head = `<tr class="vertex"><td>${esc(v.name)} <span class="muted">×${v.parallelism}</span></td>
    <td class="n">${num(v.records_in)}</td><td class="n">${rate(v.records_in_per_second)}</td>
    <td class="n">${num(v.records_out)}</td><td class="n">${rate(v.records_out_per_second)}</td>
    <td class="n">${pct(v.busy_ms_per_second)}</td><td class="n">${pct(v.backpressured_ms_per_second)}</td>
    <td class="n">${pct(v.idle_ms_per_second)}</td><td class="n">${(v.queue_fill * 100).toFixed(0)}%</td>
    <td>${wm(v.watermark)}</td><td class="n">${num(v.state_keys)}</td><td class="n">${bytes(v.state_bytes)}</td></tr>`;
  return head + v.tasks.map((t) => t.reported ? `<tr class="task" data-task="${t.task}"><td>&nbsp;&nbsp;subtask ${t.subtask} <span class="muted">(task ${t.task})</span></td>
    <td class="n">${num(t.records_in)}</td><td class="n">${rate(t.records_in_per_second)}</td>
    <td class="n">${num(t.records_out)}</td><td class="n">${rate(t.records_out_per_second)}</td>
    <td class="n">${pct(t.busy_ms_per_second)}</td><td class="n">${pct(t.backpressured_ms_per_second)}</td>
    <td class="n">${pct(t.idle_ms_per_second)}</td><td class="n">${(t.queue_fill * 100).toFixed(0)}%</td>
    <td>${wm(t.watermark)}</td><td class="n">${num(t.state_keys)}</td><td class="n">${bytes(t.state_bytes)}</td></tr>`
    : `<tr class="task"><td>&nbsp;&nbsp;subtask ${t.subtask}</td><td colspan="11" class="muted">no report yet</td></tr>`).join("");
}

// ------------------------------------------------------------------- loop
async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    if (!state.token) {
      const job = state.job ? esc(state.job) : "JOB";
      document.getElementById("main").innerHTML = '<p class="error" id="no-token">No token: '
        + 'this page needs the job\'s token in its URL (<code>/ui#token=&lt;token&gt;</code>). '
        + `On the driver's machine, as the user that runs the job, <code>lockgate dashboard ${job}</code> `
        + 'prints the whole URL (<code>lockgate list</code> shows the running jobs); so does '
        + '<code>lockgate run</code> or <code>python app.py</code> when it starts on a terminal.</p>';
      return;
    }
    if (state.job) await jobPage(state.job); else await jobsPage();
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    const where = document.getElementById("updated");
    where.textContent = (e.status === 404 && state.job ? "job no longer served: " : "error: ") + e.message;
    where.className = "error";
    return;
  } finally {
    state.busy = false;
  }
  document.getElementById("updated").className = "muted";
}

function route() {
  const p = params();
  state.token = p.token;
  state.job = p.job;
  document.getElementById("home").setAttribute("href", link(null));
  refresh();
}

window.addEventListener("hashchange", route);
route();
state.timer = setInterval(refresh, POLL_MS);
