// paymesh live page: polls /api/stats, /api/alerts and /api/traces and
// draws plain SVG and tables.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const REGION_COLORS = ["#2d62c8", "#e8710a", "#1a7f37", "#8e44ad", "#c9252d", "#00838f"];
const LAYER_COLORS = {
  idempotency_key: "#8e44ad", msg_id: "#2d62c8", recent_cache: "#00838f",
  dedup_table: "#e8710a", business_key: "#1a7f37", state_cas: "#c9252d",
};

// el builds an element: el("li", {class: "x"}, "text", child...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function fmt(n) {
  if (n >= 10000) return (n / 1000).toFixed(0) + "k";
  if (n >= 1000) return (n / 1000).toFixed(1) + "k";
  if (n >= 10 || n === 0) return n.toFixed(0);
  return n.toFixed(1);
}

// lineChart draws series [{name, color, values}] over the times (ms).
function lineChart(id, times, series) {
  const root = document.getElementById(id);
  root.replaceChildren();
  const W = 600, H = 200, L = 44, R = 8, T = 8, B = 22;
  let max = 0;
  for (const s of series) for (const v of s.values) max = Math.max(max, v);
  const top = max > 0 ? niceCeil(max) : 1;
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  root.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const f of [0, 0.5, 1]) {
    const y = H - B - f * (H - B - T);
    const t = svg("text", { x: L - 4, y: y + 4, "text-anchor": "end" });
    t.textContent = fmt(top * f);
    root.append(t);
  }
  if (times.length > 1) {
    const t0 = times[0], t1 = times[times.length - 1];
    const span = Math.max(1, t1 - t0);
    const x = (t) => L + ((t - t0) / span) * (W - L - R);
    const y = (v) => H - B - (v / top) * (H - B - T);
    const label = svg("text", { x: W - R, y: H - 6, "text-anchor": "end" });
    label.textContent = "last " + Math.round(span / 1000) + " s";
    root.append(label);
    for (const s of series) {
      const pts = s.values.map((v, i) => x(times[i]).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
      const last = s.values.length ? s.values[s.values.length - 1] : 0;
      root.append(svg("polyline", {
        class: "series", points: pts, stroke: s.color,
        "data-series": s.name, "data-n": s.values.length, "data-max": Math.max(0, ...s.values), "data-last": last,
      }));
    }
  }
  const legend = document.getElementById(id.replace("chart-", "legend-"));
  legend.replaceChildren(...series.map((s) => {
    const last = s.values.length ? s.values[s.values.length - 1] : 0;
    return el("span", {}, el("i", { style: "background:" + s.color }), s.name + " " + fmt(last));
  }));
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function regionColor(regions, r) { return REGION_COLORS[regions.indexOf(r) % REGION_COLORS.length]; }

function drawStats(st) {
  const times = st.points.map((p) => Date.parse(p.at));
  const perRegion = (field) => st.regions.map((r) => ({
    name: r, color: regionColor(st.regions, r),
    values: st.points.map((p) => (p.regions[r] ? p.regions[r][field] : 0)),
  }));
  lineChart("chart-throughput", times, perRegion("applied_per_s"));
  lineChart("chart-redeliveries", times, perRegion("redeliveries_per_s"));
  lineChart("chart-transit", times, perRegion("in_transit"));
  lineChart("chart-duplicates", times, (st.layers || []).map((l) => ({
    name: l, color: LAYER_COLORS[l] || "#687083", values: st.points.map((p) => p.duplicates_per_s[l] || 0),
  })));

  drawWebhooks(st, times);

  let deliveries = 0, redeliveries = 0, dead = 0;
  const caught = {};
  for (const t of Object.values(st.totals || {})) {
    deliveries += t.deliveries; redeliveries += t.redeliveries; dead += t.dead_letters;
    for (const [l, n] of Object.entries(t.duplicates || {})) caught[l] = (caught[l] || 0) + n;
  }
  document.getElementById("deliveries").textContent = deliveries;
  document.getElementById("redeliveries-total").textContent = redeliveries;
  document.getElementById("dead-letters").textContent = dead;
  const rows = (st.layers || []).map((l) => el("tr", { "data-layer": l },
    el("td", {}, el("span", { class: "tag layer" }, l)),
    el("td", { class: "num" }, String(caught[l] || 0)),
    el("td", { class: "num" }, deliveries ? ((100 * (caught[l] || 0)) / deliveries).toFixed(2) : "–")));
  document.querySelector("#layers tbody").replaceChildren(...rows);

  if (st.progress) {
    const p = st.progress;
    const pct = p.total ? Math.min(100, (100 * p.sent) / p.total) : 0;
    document.getElementById("progress-fill").style.width = pct + "%";
    const faults = (p.faults || []).length ? ` · faults ${(p.fired || []).length}/${p.faults.length}` +
      ((p.fired || []).length ? " (" + p.fired.join(", ") + ")" : "") : "";
    document.getElementById("progress-text").textContent = `${p.phase}: ${p.sent}/${p.total} transfers sent${faults}`;
  }
  // Once the run is over, the final report (each region and across
  // regions) replaces the live checks.
  drawChecks("invariants", st.final ? null : st.invariants);
  document.getElementById("live-title").hidden = !!st.final;
  drawChecks("final", st.final);
  document.getElementById("final-title").hidden = !st.final;
  const badge = document.getElementById("invariant-badge");
  const inv = st.final || st.invariants;
  if (inv) {
    badge.className = "badge " + (inv.ok ? "ok" : "bad");
    const age = Math.max(0, Math.round((Date.now() - Date.parse(inv.checked_at)) / 1000));
    badge.textContent = `invariants: ${inv.ok ? "PASS" : "FAIL"} (${inv.checks ? inv.checks.length : 0} checks${st.final ? ", final" : ", " + age + " s ago"})`;
  }
}

// drawWebhooks charts the receiver's deliveries and duplicates, and the
// duplicate rate over the run, when the run has a receiver.
function drawWebhooks(st, times) {
  const w = st.webhooks;
  document.getElementById("webhooks-card").hidden = !w;
  if (!w) return;
  const series = (field) => st.points.map((p) => (p.webhooks ? p.webhooks[field] : 0));
  lineChart("chart-webhooks", times, [
    { name: "deliveries", color: "#2f6fdf", values: series("received_per_s") },
    { name: "duplicates", color: "#d9480f", values: series("duplicates_per_s") },
  ]);
  document.getElementById("webhook-rate").textContent = w.received ? ((100 * w.duplicates) / w.received).toFixed(2) : "–";
}

function drawChecks(id, inv) {
  const ul = document.getElementById(id);
  if (!inv) { ul.replaceChildren(); return; }
  const items = (inv.checks || []).map((c) => el("li", { class: c.ok ? "pass" : "fail" },
    el("span", { class: "v" }, c.ok ? "PASS" : "FAIL"), `${c.name} (${c.checked} checked)`,
    c.failures && c.failures.length ? el("ul", {}, ...c.failures.map((f) => el("li", {}, f))) : null));
  if (inv.error) items.push(el("li", { class: "fail" }, el("span", { class: "v" }, "ERROR"), inv.error));
  ul.replaceChildren(...items);
}

// drawAlerts fills the Alerts panel: the alerts pending or firing now,
// and those that fired and cleared during the run.
function drawAlerts(a) {
  const when = (t) => (t ? new Date(t).toLocaleTimeString() : "–");
  const ago = (t) => Math.max(0, Math.round((Date.now() - Date.parse(t)) / 1000));
  const cells = (x) => [el("td", {}, x.name), el("td", {}, x.region ? el("span", { class: "tag region" }, x.region) : "–"), el("td", {}, x.topic || "–")];
  const active = (a.active || []).map((x) => el("tr", { "data-alert": x.name, "data-state": x.state, class: "alert " + x.state, title: x.summary || "" },
    ...cells(x), el("td", {}, el("span", { class: "state " + x.state }, x.state)), el("td", {}, `${when(x.since)} (${ago(x.since)} s ago)`)));
  document.querySelector("#alerts tbody").replaceChildren(...active);
  const cleared = (a.cleared || []).slice().reverse().map((x) => el("tr", { "data-alert": x.name, "data-state": "cleared", class: "alert cleared", title: x.summary || "" },
    ...cells(x), el("td", {}, when(x.fired_at)), el("td", {}, when(x.cleared_at))));
  document.querySelector("#alerts-cleared tbody").replaceChildren(...(cleared.length ? cleared : [el("tr", { class: "empty" }, el("td", { colspan: 5 }, "none"))]));
  let note;
  if (!a.enabled) note = "alerts: off (" + a.note + ")";
  else if (a.error) note = "alerts: " + a.note + " · last poll failed: " + a.error;
  else note = "alerts: " + a.note + " · " + (active.length ? active.length + " active" : "none active");
  const p = document.getElementById("alerts-note");
  p.textContent = note;
  p.dataset.enabled = String(!!a.enabled);
  document.getElementById("alerts").hidden = !a.enabled;
}

let selected = null;

function drawTraces(list) {
  const ul = document.getElementById("traces");
  if (!list.length) { ul.replaceChildren(el("li", { class: "empty" }, "none yet")); return; }
  ul.replaceChildren(...list.slice(0, 100).map((t) => el("li", {
    "data-trace": t.trace_id, class: t.trace_id === selected ? "selected" : "", onclick: () => openTrace(t.trace_id),
  },
  el("span", { class: "when" }, new Date(t.start).toLocaleTimeString()), t.root, " ",
  ...t.regions.map((r) => el("span", { class: "tag region" }, r)),
  ...t.reasons.map((r) => el("span", { class: "tag reason" }, r)),
  ...t.layers.map((l) => el("span", { class: "tag layer" }, "caught by " + l)))));
}

async function openTrace(id) {
  selected = id;
  document.querySelectorAll("#traces li").forEach((li) => li.classList.toggle("selected", li.dataset.trace === id));
  const res = await fetch("api/traces/" + id);
  const tree = document.getElementById("span-tree");
  document.getElementById("trace-id").textContent = id;
  if (!res.ok) {
    tree.replaceChildren(el("p", { class: "note" }, (await res.json()).error));
    return;
  }
  drawTrace(await res.json());
}

// drawTrace draws the spans as a tree (children under their parent,
// across regions) with a waterfall of their timing.
function drawTrace(t) {
  const spans = t.span_list;
  const byID = new Map(spans.map((s) => [s.span_id, s]));
  const children = new Map();
  const roots = [];
  for (const s of spans) {
    if (s.parent_id && byID.has(s.parent_id)) {
      if (!children.has(s.parent_id)) children.set(s.parent_id, []);
      children.get(s.parent_id).push(s);
    } else roots.push(s);
  }
  const t0 = Math.min(...spans.map((s) => Date.parse(s.start)));
  const t1 = Math.max(...spans.map((s) => Date.parse(s.start) + s.duration_ms));
  const total = Math.max(1, t1 - t0);
  document.getElementById("trace-meta").replaceChildren(el("p", { class: "note" },
    `${spans.length} spans in ${t.regions.join(", ")} over ${total.toFixed(0)} ms · `, ...t.reasons.map((r) => el("span", { class: "tag reason" }, r)),
    ...t.layers.map((l) => el("span", { class: "tag layer" }, "caught by " + l))));
  const rows = [];
  const walk = (s, depth) => {
    rows.push(spanRow(s, depth, t0, total, byID));
    for (const c of children.get(s.span_id) || []) walk(c, depth + 1);
  };
  for (const r of roots) walk(r, 0);
  document.getElementById("span-tree").replaceChildren(...rows);
}

function spanRow(s, depth, t0, total, byID) {
  const a = s.attributes || {};
  const tags = [];
  if (s.region) tags.push(el("span", { class: "tag region" }, s.region));
  if (a["paymesh.dedup.outcome"] === "duplicate") tags.push(el("span", { class: "tag layer", "data-layer": a["paymesh.dedup.layer"] }, "duplicate · " + a["paymesh.dedup.layer"]));
  else if (a["paymesh.dedup.outcome"]) tags.push(el("span", { class: "tag first" }, a["paymesh.dedup.outcome"]));
  if (a["messaging.nats.delivery_count"] && a["messaging.nats.delivery_count"] !== "1") tags.push(el("span", { class: "tag reason" }, "delivery #" + a["messaging.nats.delivery_count"]));
  const details = [];
  if (a["messaging.message.id"]) details.push("msg " + a["messaging.message.id"]);
  if (a["messaging.nats.stream_sequence"]) details.push("seq " + a["messaging.nats.stream_sequence"]);
  if (a["paymesh.result"]) details.push("result " + a["paymesh.result"]);
  if (s.error) details.push("error: " + s.error);
  for (const e of s.events || []) details.push(e.name + (e.attributes && e.attributes["paymesh.attempt"] ? " (attempt " + e.attributes["paymesh.attempt"] + ")" : ""));
  const links = (s.links || []).map((l) => {
    const target = byID.get(l.span_id);
    return el("a", { onclick: () => highlight(l.span_id) }, "↪ links to " + (l.kind ? l.kind.replace("_", " ") : "span") + (target ? " (" + target.name + ")" : " " + l.span_id));
  });
  const left = ((Date.parse(s.start) - t0) / total) * 100;
  const width = (s.duration_ms / total) * 100;
  return el("div", { class: "span" + (s.error ? " error" : ""), "data-span": s.span_id },
    el("div", { class: "name", style: "padding-left:" + depth * 1.1 + "rem", title: s.name }, s.name, " ", ...tags),
    el("div", { class: "timeline", title: s.duration_ms.toFixed(2) + " ms" }, el("div", { class: "b", style: `left:${left}%;width:${width}%` })),
    details.length || links.length ? el("div", { class: "detail" }, details.join(" · "), " ", ...links) : null);
}

function highlight(spanID) {
  document.querySelectorAll("#span-tree .span").forEach((d) => d.classList.toggle("highlight", d.dataset.span === spanID));
  const target = document.querySelector(`#span-tree .span[data-span="${spanID}"]`);
  if (target) target.scrollIntoView({ block: "nearest" });
}

// poll fetches the demo's state and draws each part on its own: a part
// that fails to draw (or a fetch that fails) is named in the error line,
// the other parts are drawn, and the next poll tries again.
async function poll() {
  const errors = [];
  const get = (path) => fetch(path).then((r) => r.json()).catch((e) => { errors.push(path + ": " + e.message); return null; });
  const [st, traces, alerts] = await Promise.all([get("api/stats"), get("api/traces"), get("api/alerts")]);
  const draw = (name, f, data) => {
    if (data === null) return;
    try { f(data); } catch (e) { errors.push(name + ": " + e.message); }
  };
  draw("stats", drawStats, st);
  draw("alerts", drawAlerts, alerts);
  draw("traces", drawTraces, traces);
  const line = document.getElementById("page-error");
  line.hidden = errors.length === 0;
  line.textContent = errors.length ? "not updated: " + errors.join("; ") : "";
  if (errors.length) {
    pageErrors += errors.length;
    document.body.dataset.errors = String(pageErrors);
  }
  if (st !== null && traces !== null && alerts !== null) document.body.dataset.updated = String(Date.now());
}

// pageErrors counts the parts that failed to update since the page opened.
let pageErrors = 0;

poll();
setInterval(poll, 1000);
