// hpnlab fabric view: the SVG of hpnlab.fabric.web.view.svg, recoloured by frames (SSE live, or a replay).
"use strict";
const $ = (id) => document.getElementById(id);
const state = { layout: null, mode: null, idle: "#c7c7c7", frame: null, frames: [], halves: {}, nodes: {},
                links: {}, received: [], inject: false };
window.hpnlabStats = { frames: 0, rate: 0, lastT: null, applied: 0 };

// a moment: seconds, or microseconds for a model run's steps
function fmtT(t) { return t > 0 && t < 0.01 ? `${(t * 1e6).toFixed(2)} µs` : `${t.toFixed(2)} s`; }
function fmt(v, unit) { return v === null || v === undefined ? "—" : (Math.round(v * 100) / 100) + (unit || ""); }

function applyFrame(fr) {
  state.frame = fr;
  const seen = new Set();
  for (const [lid, e] of Object.entries(fr.links)) {
    for (const d of ["ab", "ba"]) {
      const el = state.halves[`L:${lid}:${d}`];
      if (!el) continue;
      el.setAttribute("stroke", e[d].colour);
      el.classList.toggle("gray", e.state === "gray");
      el.dataset.state = e.state;
      seen.add(el.id);
    }
  }
  for (const [id, el] of Object.entries(state.halves)) {
    if (!seen.has(id) && el.getAttribute("stroke") !== state.idle) {
      el.setAttribute("stroke", state.idle); el.classList.remove("gray"); el.dataset.state = "up";
    } else if (!seen.has(id)) { el.dataset.state = "up"; }
  }
  const down = new Set(fr.switches_down || []);
  for (const [id, shape] of Object.entries(state.nodes)) shape.classList.toggle("down", down.has(id));
  $("clock").textContent = `t = ${fmtT(fr.t)}`;
  const c = fr.collective || {};
  $("collective").textContent = Object.keys(c).length ? Object.entries(c).map(([k, v]) => `${k}: ${typeof v === "number" ? fmt(v) : v}`).join("\n") : "—";
  const k = fr.controller || {};
  $("controller").textContent = Object.keys(k).length ? Object.entries(k).map(([a, b]) => `${a}: ${b}`).join("\n") : "—";
  const ev = $("events"); ev.innerHTML = "";
  for (const e of (fr.events || []).slice().reverse()) {
    const li = document.createElement("li"); li.textContent = `+${fmt(e.t)} s ${e.text}` + (e.source === "web" ? " (web)" : "");
    ev.appendChild(li);
  }
  window.hpnlabStats.applied += 1; window.hpnlabStats.lastT = fr.t;
}

function countFrame() {
  const now = performance.now();
  state.received.push(now);
  while (state.received.length && state.received[0] < now - 5000) state.received.shift();
  const span = (now - state.received[0]) / 1000;
  window.hpnlabStats.frames += 1;
  window.hpnlabStats.rate = span > 0 ? (state.received.length - 1) / span : 0;
  $("rate").textContent = `${window.hpnlabStats.rate.toFixed(1)} frames/s`;
}

function tip(evt, text) {
  const t = $("tip"); t.hidden = !text; t.textContent = text || "";
  if (text) { t.style.left = (evt.clientX + 12) + "px"; t.style.top = (evt.clientY + 12) + "px"; }
}

function linkText(lid) {
  const lk = state.links[lid]; const e = (state.frame && state.frame.links[lid]) || null;
  const lines = [`${lid} (${lk.kind}${lk.rail !== null && lk.rail !== undefined ? ", rail " + lk.rail : ""}` +
                 `${lk.members ? ", " + lk.members + " links" : ""}, ${lk.rate_gbps} Gbit/s)`,
                 `state: ${e ? e.state : "up"}`];
  for (const [d, from, to] of [["ab", lk.a, lk.b], ["ba", lk.b, lk.a]]) {
    const v = e ? e[d] : {};
    lines.push(`${from} → ${to}: ${fmt((v.util || 0) * 100, "%")}, ${fmt(v.mbps, " Mbit/s")}, CE ${fmt(v.ce_pps, "/s")}` +
               ` (${fmt((v.ce_fraction || 0) * 100, "%")}), drops ${fmt(v.drops)}, queue ${fmt(v.queue_bytes, " B")}` +
               (v.peak !== undefined ? `, busiest member link ${fmt(v.peak * 100, "%")}` : ""));
  }
  return lines.join("\n");
}

async function inject(body) {
  const r = await fetch("inject", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const out = await r.json();
  $("status").textContent = out.error ? `refused: ${out.error}` : `applied: ${out.applied.map((x) => x.action + " " + x.target.join("-")).join(", ") || "nothing to repair"}`;
  $("status").className = out.error ? "failed-msg" : "";
}

function onLinkClick(evt) {
  const el = evt.target; const lid = el.dataset.link; const lk = state.links[lid];
  const action = $("click").value;
  if (action === "inspect" || !state.inject) { tip(evt, linkText(lid)); return; }
  const nearer = el.id.endsWith(":ab") ? lk.a : lk.b;
  const link = [lk.a, lk.b];
  if (action === "link_down") inject({ action, link, key: lk.key });
  else if (action === "link_down_one_side" || action === "link_drop") inject({ action, link, key: lk.key, side: nearer });
  else if (action === "repair") inject({ action: "repair", link, key: lk.key });
  else if (action === "switch_down") { const sw = state.layout.nodes.find((n) => n.id === nearer && n.tier > 0); if (sw) inject({ action, switch: sw.id }); }
}

function onNodeClick(evt, id, tier) {
  const action = $("click").value;
  if (!state.inject || tier === 0 || state.layout.aggregated) return;
  if (action === "switch_down") inject({ action, switch: id });
  else if (action === "repair") inject({ action: "repair", switch: id });
}

function svgText() {
  const svg = $("fabric").querySelector("svg");
  return new XMLSerializer().serializeToString(svg);
}

function download(name, href) { const a = document.createElement("a"); a.href = href; a.download = name; a.click(); }

function stillName(ext) { return `hpnlab-${state.layout.scenario}-t${state.frame ? state.frame.t : 0}.${ext}`; }

function exportSvg() { download(stillName("svg"), URL.createObjectURL(new Blob([svgText()], { type: "image/svg+xml" }))); }

function pngDataUrl() {
  return new Promise((resolve) => {
    const img = new Image(); const L = state.layout;
    img.onload = () => {
      const c = document.createElement("canvas"); c.width = L.width * 2; c.height = L.height * 2;
      const ctx = c.getContext("2d"); ctx.scale(2, 2); ctx.drawImage(img, 0, 0); resolve(c.toDataURL("image/png"));
    };
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText());
  });
}
window.hpnlabPng = pngDataUrl;

async function exportPng() { download(stillName("png"), await pngDataUrl()); }

function showAt(i) {
  const fr = state.frames[i]; if (!fr) return;
  $("scrubber").value = i; $("scrubt").textContent = `${fmtT(fr.t)} / ${fmtT(state.frames[state.frames.length - 1].t)}`;
  applyFrame(fr);
}
// the frame at time t: the last at or before it (as view.frame_at)
window.hpnlabSeek = (t) => {
  let best = 0;
  for (let i = 0; i < state.frames.length; i++) { if (state.frames[i].t <= t + 1e-9) best = i; else break; }
  showAt(best); return state.frames[best].t;
};

async function main() {
  const info = await (await fetch("layout.json")).json();
  state.layout = info.layout; state.mode = info.mode; state.inject = info.inject; state.idle = info.idle || state.idle;
  for (const lk of state.layout.links) state.links[lk.id] = lk;
  $("scenario").textContent = state.layout.scenario + (state.layout.aggregated ? " (aggregated by plane, pod and tier)" : "");
  $("mode").textContent = info.mode;
  $("clickbox").hidden = !info.inject;
  $("fabric").innerHTML = await (await fetch("fabric.svg")).text();
  for (const el of document.querySelectorAll("#fabric line.lk")) {
    state.halves[el.id] = el;
    el.addEventListener("mousemove", (e) => { if ($("click").value === "inspect" || !state.inject) tip(e, linkText(el.dataset.link)); });
    el.addEventListener("mouseleave", (e) => tip(e, null));
    el.addEventListener("click", onLinkClick);
  }
  for (const g of document.querySelectorAll("#fabric g[data-node]")) {
    const n = state.layout.nodes.find((x) => "N:" + x.el === g.id);
    const shape = g.querySelector("circle.nd, rect.nd");
    if (n && n.tier > 0) state.nodes[n.id] = shape;
    g.addEventListener("click", (e) => onNodeClick(e, n.id, n.tier));
  }
  $("svgbtn").onclick = exportSvg; $("pngbtn").onclick = exportPng;
  if (info.mode === "live") {
    const es = new EventSource("events");
    es.onmessage = (m) => { countFrame(); applyFrame(JSON.parse(m.data)); };
    es.onerror = () => { $("status").textContent = "stream interrupted (reconnecting)"; };
  } else {
    state.frames = await (await fetch("frames.json")).json();
    $("scrub").hidden = false;
    const s = $("scrubber"); s.max = state.frames.length - 1;
    s.oninput = () => showAt(Number(s.value));
    let timer = null;
    $("play").onclick = () => {
      if (timer) { clearInterval(timer); timer = null; $("play").textContent = "play"; return; }
      $("play").textContent = "pause";
      timer = setInterval(() => { const i = Number(s.value) + 1; if (i >= state.frames.length) { clearInterval(timer); timer = null; $("play").textContent = "play"; } else showAt(i); }, 250);
    };
    showAt(0);
  }
  document.body.dataset.ready = "1";
}
main();
