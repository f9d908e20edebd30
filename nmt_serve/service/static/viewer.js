// Attention viewer: talks to the public API only (/v1/models, /v1/attention); no external assets.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const CELL = 28;
let data = null; // the last /v1/attention reply
// a sample sentence per source language: the page opens on a pair whose source it is in (de -> en
// first), and follows the pair while the user has not typed a sentence of their own
const SAMPLES = {
  de: "Ein Hund rennt über die grüne Wiese.",
  en: "A dog runs across the green meadow.",
  fr: "Un chien court sur la prairie verte.",
  cs: "Pes běží přes zelenou louku.",
};
const PREFERRED_PAIRS = ["de-en", "en-de"];

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

async function api(path, body) {
  let response;
  try {
    const headers = {"content-type": "application/json"};
    const key = $("apikey").value.trim();
    if (key) headers.authorization = `Bearer ${key}`;
    response = await fetch(path, body === undefined ? {headers} : {method: "POST", headers, body: JSON.stringify(body)});
  } catch (e) {
    throw new Error("The server cannot be reached. Is it running?");
  }
  let payload = null;
  try { payload = await response.json(); } catch (e) { /* not JSON */ }
  if (!response.ok) {
    let message = payload && payload.error ? payload.error.message : `HTTP ${response.status}`;
    if (response.status === 401) message = "this server needs an API key: enter it in the API key field";
    throw new Error(message);
  }
  return payload;
}

async function loadModels() {
  try {
    const reply = await api("/v1/models");
    const select = $("pair");
    select.innerHTML = "";
    for (const m of reply.models) {
      const option = document.createElement("option");
      option.value = `${m.source}-${m.target}`;
      option.textContent = `${m.source} → ${m.target}`;
      select.appendChild(option);
    }
    const pairs = reply.models.map((m) => `${m.source}-${m.target}`);
    const start = PREFERRED_PAIRS.find((p) => pairs.includes(p)) || pairs.find((p) => p.split("-")[0] in SAMPLES);
    if (start) select.value = start;
    showSample();
    clearError();
    if (!reply.models.length) showError("The server has no models loaded yet. Reload the page in a moment.");
  } catch (e) {
    showError(`Could not list the models: ${e.message}`);
  }
}

function showSample() {
  // only while the textarea holds one of our samples: a user's own sentence is never replaced
  const text = $("source").value.trim();
  if (text && !Object.values(SAMPLES).includes(text)) return;
  const sample = SAMPLES[$("pair").value.split("-")[0]];
  if (sample) $("source").value = sample;
}

function fillSelect(select, count, label) {
  const keep = select.value;
  select.innerHTML = "";
  for (let i = 0; i < count; i++) {
    const option = document.createElement("option");
    option.value = String(i);
    option.textContent = `${label} ${i + 1}`;
    select.appendChild(option);
  }
  select.value = keep && Number(keep) < count ? keep : String(count - 1);
}

// one layer's map for the chosen head, or the mean over heads
function selectHeads(perHead) {
  if ($("average").checked) {
    return perHead[0].map((row, r) => row.map((_, c) => perHead.reduce((sum, head) => sum + head[r][c], 0) / perHead.length));
  }
  return perHead[Number($("head").value)];
}

// sentencepiece marks a word's start with ▁, which reads as noise on a label: drop it; a piece that is
// only the marker (a lone space) still needs something visible to hover
const SPACE = "␣";
function shown(token) {
  const rest = token.startsWith("▁") ? token.slice(1) : token;
  return token && !rest ? SPACE : rest.replaceAll("▁", SPACE);
}

// the matrix on screen: rows x cols of weights, with their token labels
function currentMatrix() {
  const view = $("view").value;
  const layer = Number($("layer").value);
  const matrix = selectHeads(data[view][layer]);
  const rows = (view === "encoder_self" ? data.source_tokens : data.target_tokens).map(shown);
  const cols = (view === "decoder_self" ? data.target_tokens : data.source_tokens).map(shown);
  return {matrix, rows, cols, view, layer};
}

// `share` in 0..1 of the colour scale; the scale runs to the largest weight on screen, so that diffuse
// maps (averaged heads, self-attention) are not all pale
function color(share) {
  const light = Math.round(97 - 70 * Math.min(1, Math.max(0, share)));
  return `hsl(214, 80%, ${light}%)`;
}

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const LEGEND = {width: 220, bar: 12, height: 58};

// the colour scale, in the SVG itself so that a downloaded heatmap keeps it
function drawLegend(svg, x, y, max) {
  const gradient = el("linearGradient", {id: "legend-gradient", x1: 0, x2: 1, y1: 0, y2: 0});
  for (let i = 0; i <= 10; i++) gradient.appendChild(el("stop", {offset: i / 10, "stop-color": color(i / 10)}));
  svg.appendChild(el("defs", {})).appendChild(gradient);
  const legend = svg.appendChild(el("g", {class: "legend", "data-max": max, "font-size": "12", fill: "#1d2430"}));
  legend.appendChild(el("text", {x, y: y + 12, class: "legend-title"}, "attention weight"));
  legend.appendChild(el("rect", {x, y: y + 20, width: LEGEND.width, height: LEGEND.bar, fill: "url(#legend-gradient)",
                                 stroke: "#8a93a3", "stroke-width": 0.5, class: "legend-bar"}));
  [0, 0.5, 1].forEach((share) => {
    const tx = x + share * LEGEND.width;
    legend.appendChild(el("line", {x1: tx, x2: tx, y1: y + 20 + LEGEND.bar, y2: y + 24 + LEGEND.bar, stroke: "#5a6372"}));
    const anchor = share === 0 ? "start" : share === 1 ? "end" : "middle";
    legend.appendChild(el("text", {x: tx, y: y + 37 + LEGEND.bar, "text-anchor": anchor, class: "legend-tick"},
                          share === 0 ? "0" : (share * max).toFixed(2)));
  });
}

function drawHeatmap() {
  const {matrix, rows, cols, view, layer} = currentMatrix();
  const left = 12 + 8 * Math.max(...rows.map((t) => t.length));
  const top = 12 + 8 * Math.max(...cols.map((t) => t.length));
  const max = Math.max(...matrix.flat()) || 1;
  const bottom = top + CELL * rows.length + 10;
  const svg = el("svg", {xmlns: SVG, width: Math.max(left + CELL * cols.length, left + LEGEND.width) + 10, height: bottom + LEGEND.height,
                         "data-view": view, "data-layer": layer, "font-family": "sans-serif", "font-size": "13"});
  svg.appendChild(el("rect", {x: 0, y: 0, width: "100%", height: "100%", fill: "white"}));
  cols.forEach((token, c) => {
    const x = left + c * CELL + CELL / 2;
    svg.appendChild(el("text", {x, y: top - 6, transform: `rotate(-60 ${x} ${top - 6})`, class: "col-label"}, token));
  });
  rows.forEach((token, r) => {
    svg.appendChild(el("text", {x: left - 6, y: top + r * CELL + CELL / 2 + 4, "text-anchor": "end", class: "row-label"}, token));
    matrix[r].forEach((weight, c) => {
      const cell = el("rect", {x: left + c * CELL, y: top + r * CELL, width: CELL - 1, height: CELL - 1, fill: color(weight / max),
                               class: "cell", "data-row": r, "data-col": c, "data-weight": weight.toFixed(4)});
      cell.appendChild(el("title", {}, `${token} → ${cols[c]}: ${weight.toFixed(3)}`));
      svg.appendChild(cell);
    });
  });
  drawLegend(svg, left, bottom, max);
  $("heatmap").replaceChildren(svg);
}

function drawAlignment() {
  const layer = Math.min(Number($("layer").value), data.cross.length - 1);
  const cross = selectHeads(data.cross[layer]);
  const src = data.source_tokens.map(shown), tgt = data.target_tokens.map(shown);
  const width = 10 + 90 * Math.max(src.length, tgt.length);
  const svg = el("svg", {xmlns: SVG, width, height: 140, "font-family": "sans-serif", "font-size": "13"});
  const xs = (n, i) => 45 + i * ((width - 90) / Math.max(1, n - 1));
  src.forEach((t, i) => svg.appendChild(el("text", {x: xs(src.length, i), y: 20, "text-anchor": "middle", class: "src-token"}, t)));
  tgt.forEach((t, j) => {
    const row = cross[j];
    const best = row.indexOf(Math.max(...row));
    svg.appendChild(el("line", {x1: xs(tgt.length, j), y1: 110, x2: xs(src.length, best), y2: 28, stroke: "#2a6fd6",
                                "stroke-width": 1 + 3 * row[best], class: "link", "data-target": j, "data-source": best}));
    svg.appendChild(el("text", {x: xs(tgt.length, j), y: 128, "text-anchor": "middle", class: "tgt-token"}, t));
  });
  $("alignment").replaceChildren(svg);
}

function redraw() {
  $("head").disabled = $("average").checked;
  const view = $("view").value;
  fillSelect($("layer"), data[view].length, "layer");
  drawHeatmap();
  drawAlignment();
}

async function run(event) {
  event.preventDefault();
  clearError();
  const [source, target] = $("pair").value.split("-");
  const text = $("source").value.trim();
  if (!text) { showError("Type a source sentence first."); return; }
  const body = {text, source, target, include: ["cross", "decoder_self", "encoder_self"]};
  const given = $("target").value.trim();
  if (given) body.target_text = given;
  $("run").disabled = true;
  $("status").textContent = "Translating…";
  try {
    data = await api("/v1/attention", body);
    $("translation").textContent = data.translation;
    $("score").textContent = `(log-probability ${data.score.toFixed(2)})`;
    fillSelect($("layer"), data.num_layers, "layer");
    fillSelect($("head"), data.num_heads, "head");
    $("head").value = "0";
    $("result").hidden = false;
    redraw();
    $("status").textContent = "";
  } catch (e) {
    $("status").textContent = "";
    showError(`Could not get the attention maps: ${e.message}`);
  } finally {
    $("run").disabled = false;
  }
}

function download() {
  const svg = $("heatmap").querySelector("svg");
  const {view, layer} = currentMatrix();
  const head = $("average").checked ? "avg" : `head${Number($("head").value) + 1}`;
  const blob = new Blob([new XMLSerializer().serializeToString(svg)], {type: "image/svg+xml"});
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `attention-${view}-layer${layer + 1}-${head}.svg`;
  document.body.appendChild(link);
  link.click();
  link.remove();
}

function tooltip(event) {
  const cell = event.target.closest("rect.cell");
  const tip = $("tooltip");
  if (!cell) { tip.hidden = true; return; }
  tip.textContent = cell.querySelector("title").textContent;
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
  tip.hidden = false;
}

$("query").addEventListener("submit", run);
$("apikey").addEventListener("change", loadModels);
$("pair").addEventListener("change", showSample);
for (const id of ["view", "layer", "head", "average"]) $(id).addEventListener("change", redraw);
$("download").addEventListener("click", download);
$("heatmap").addEventListener("mousemove", tooltip);
$("heatmap").addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
loadModels();
