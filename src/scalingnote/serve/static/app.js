// scalingnote search page. Documents are untrusted text: every field is written with
// textContent (never parsed as HTML), so markup in a title or snippet shows as text.
"use strict";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function setStatus(text, isError) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = isError ? "error" : "";
}

function renderHits(hits) {
  const list = document.getElementById("results");
  list.replaceChildren();
  for (const hit of hits) {
    const li = el("li", "hit");
    li.dataset.docId = String(hit.doc_id);
    li.appendChild(el("div", "title", hit.title ? hit.title : "(untitled)"));
    const sem = Array.isArray(hit.semantic_id) ? hit.semantic_id.join("-") : "none";
    li.appendChild(el("div", "meta", "doc " + hit.doc_id + " · score " + Number(hit.score).toFixed(4) + " · semantic ID " + sem));
    if (hit.snippet) li.appendChild(el("p", "snippet", hit.snippet));
    list.appendChild(li);
  }
}

async function search(ev) {
  ev.preventDefault();
  const query = document.getElementById("query").value;
  const mode = document.getElementById("mode").value;
  const k = parseInt(document.getElementById("k").value, 10) || 10;
  if (!query.trim()) { setStatus("Type a query first.", true); return; }
  setStatus("Searching…", false);
  const t0 = performance.now();
  let resp, body;
  try {
    resp = await fetch("/search", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ query: query, k: k, mode: mode }),
    });
    body = await resp.json();
  } catch (err) {
    setStatus("Request failed: " + err, true);
    return;
  }
  const roundTrip = performance.now() - t0;
  if (!resp.ok) {
    document.getElementById("results").replaceChildren();
    setStatus("Error " + resp.status + ": " + (body && body.detail ? body.detail : "request refused"), true);
    return;
  }
  renderHits(body.results);
  setStatus(body.results.length + " results (" + mode + ") · service " + Number(body.took_ms).toFixed(1) +
            " ms · round trip " + roundTrip.toFixed(1) + " ms", false);
}

async function loadInfo() {
  try {
    const r = await fetch("/healthz");
    const h = await r.json();
    if (h.status !== "ok") { setStatus("Service " + h.status + ": " + (h.detail || "loading"), true); return; }
    const modes = Array.isArray(h.modes) ? h.modes : ["dense"];
    const select = document.getElementById("mode");
    for (const opt of Array.from(select.options)) {
      opt.disabled = !modes.includes(opt.value);
    }
    // the service's default (the index's fusion.json), as `scalingnote search` and a request without "mode" use it
    if (modes.includes(h.default_mode)) select.value = h.default_mode;
    if (select.selectedOptions.length && select.selectedOptions[0].disabled) select.value = "dense";
    const idx = h.index || {};
    document.getElementById("service-info").textContent =
      "index " + idx.factory + " · " + idx.n_vectors + " documents · query tower " +
      ((h.query_tower || {}).name || "?") + " · modes " + modes.join(", ");
  } catch (err) {
    setStatus("Service unreachable: " + err, true);
  }
}

document.addEventListener("DOMContentLoaded", function () {
  document.getElementById("search-form").addEventListener("submit", search);
  loadInfo();
});
