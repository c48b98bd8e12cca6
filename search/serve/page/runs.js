// The runs page: GET runs.json, drawn with plotly.js (served by this server: plotly.min.js). Every text from
// the workspace goes into the page as text (textContent), never as HTML; the charts' titles and trace names
// are this file's own.
const $ = (id) => document.getElementById(id);
const statusLine = $("status"), keyForm = $("key-form"), keyBox = $("key");
const urlKey = new URLSearchParams(location.search).get("api_key");
const CONFIG = { displaylogo: false, responsive: true };
const LAYOUT = { margin: { l: 70, r: 70, t: 40, b: 50 }, legend: { orientation: "h", y: 1.12 }, hovermode: "closest" };
const MODES = ["lexical", "dense", "hybrid"];
const pending = [];

function show(message, isError) { statusLine.textContent = message; statusLine.className = isError ? "error" : ""; }
function element(tag, className, text) { const e = document.createElement(tag); if (className) e.className = className; if (text !== undefined) e.textContent = text; return e; }
function fmt(x, digits = 3) { return x === null || x === undefined ? "–" : Number(x).toLocaleString("en", { maximumSignificantDigits: digits }); }
function axis(title, extra) { return { title: { text: title }, automargin: true, ...extra }; }
function line(name, points, extra) {
  return { type: "scatter", mode: "lines+markers", name, x: points.map(p => p[0]), y: points.map(p => p[1]), marker: { size: 5 }, ...extra };
}
function draw(id, traces, title, layout) {
  const div = $(id);
  div.hidden = false;  // shown before drawing: plotly sizes a chart by its container
  pending.push(Plotly.newPlot(div, traces, { ...LAYOUT, title: { text: title }, ...layout }, CONFIG));
}
function cell(row, text, tag = "td") { row.append(element(tag, "", text)); }

function showPretraining(run) {
  $("pretraining").hidden = false;
  const model = run.model || {}, end = run.end;
  const said = [];
  if (model.preset) said.push("model " + model.preset + (model.parameters ? " (" + fmt(model.parameters) + " parameters)" : ""));
  if (run.train.length) said.push(run.train[run.train.length - 1].step + " steps logged (" + run.train[run.train.length - 1].strategy + ")");
  if (end && end.val_loss_reached !== null && end.val_loss_reached !== undefined) {
    said.push("validation loss reached " + fmt(end.val_loss_reached, 4) + " (a model that learned nothing: " + fmt(end.uniform_loss, 4) + ")");
    if (end.best_step !== null && end.best_step !== undefined) {
      said.push("exported: the best validation step, " + end.best_step + " (loss " + fmt(end.best_val_loss, 4) + ")");
    }
    if (model.stopped_early) said.push("stopped early at step " + model.steps + " of " + model.planned_steps + " planned");
  } else if (!end) said.push("no end record yet: the run is in progress or was stopped");
  if (run.resumes.length) said.push("resumed " + run.resumes.length + " time(s), at step " + run.resumes.map(r => r.step).join(", "));
  $("pretraining-summary").textContent = said.join("; ") + ".";

  draw("chart-loss", [line("train", run.train.map(r => [r.step, r.loss])), line("validation", run.val.map(r => [r.step, r.val_loss]))],
    "Loss", { xaxis: axis("step"), yaxis: axis("nats per token") });
  draw("chart-tokens", [line("tokens/s", run.train.map(r => [r.step, r.tokens_per_s]))], "Throughput",
    { xaxis: axis("step"), yaxis: axis("tokens/s", { rangemode: "tozero" }) });
  draw("chart-mfu", [line("MFU", run.train.map(r => [r.step, r.mfu === null ? null : 100 * r.mfu]))], "Model FLOPs utilisation",
    { xaxis: axis("step"), yaxis: axis("% of this machine's measured matmul peak", { rangemode: "tozero" }) });

  const plan = run.plan;
  if (plan) {
    const predicted = run.train.filter(r => r.predicted_step_s !== null && r.predicted_step_s !== undefined);
    $("plan-summary").textContent = "Plan " + plan.plan + (plan.main_cost ? " (main cost: " + plan.main_cost + ")" : "") +
      ": predicted " + fmt(plan.predicted_step_s) + " s a step, measured " + fmt(plan.measured_step_s) + " s (median); peak memory predicted " +
      fmt(plan.predicted_peak_mem_mb, 4) + " MB, measured " + fmt(plan.measured_peak_mem_mb, 4) + " MB (largest).";
    draw("chart-plan-step", [line("predicted", predicted.map(r => [r.step, r.predicted_step_s])), line("measured", predicted.map(r => [r.step, r.measured_step_s]))],
      "Step time: the plan's prediction and the run", { xaxis: axis("step"), yaxis: axis("seconds", { rangemode: "tozero" }) });
    draw("chart-plan-memory", [line("predicted", predicted.map(r => [r.step, r.predicted_peak_mem_mb])), line("measured", predicted.map(r => [r.step, r.measured_peak_mem_mb]))],
      "Peak memory: the plan's prediction and the run", { xaxis: axis("step"), yaxis: axis("MB", { rangemode: "tozero" }) });
  } else {
    $("plan-summary").textContent = "No plan prediction for this run: the planner predicts step time and memory on a machine " +
      "it measured (pipeline plan, or pipeline pretrain --strategy auto).";
  }

  const sizing = run.sizing;
  if (!sizing) {
    $("sizing-summary").textContent = "Not sized: the run's shape was given (--preset, a model shape or a step count).";
    return;
  }
  let said_sizing = "Each shape timed here (" + sizing.device + ", " + sizing.processes + " process(es)) for a budget of " + fmt(sizing.budget_s) +
    " s of training on " + fmt(sizing.unique_tokens) + " distinct tokens, ranked by the scaling law (1: the lowest loss it predicts; a ranking, not a forecast).";
  if (sizing.other_load >= 0.25) said_sizing += " Other processes used " + Math.round(100 * sizing.other_load) + "% of the cores while the shapes were timed.";
  $("sizing-summary").textContent = said_sizing;
  const table = $("sizing-table"), head = table.querySelector("thead tr"), body = table.querySelector("tbody");
  for (const name of ["rank", "layers", "d", "heads", "parameters", "ms/step", "steps", "tokens", "epochs", "chosen"]) cell(head, name, "th");
  for (const shape of [...sizing.shapes].sort((a, b) => a.law_rank - b.law_rank)) {
    const row = element("tr", shape.chosen ? "chosen" : "");
    for (const value of [shape.law_rank, shape.n_layer, shape.n_embd, shape.n_head, fmt(shape.parameters), fmt(1000 * shape.step_s),
      shape.steps.toLocaleString("en"), fmt(shape.tokens), fmt(shape.epochs, 2), shape.chosen ? "yes" : ""]) cell(row, String(value));
    body.append(row);
  }
  table.hidden = false;
}

function showAdaptation(adaptation) {
  $("adaptation").hidden = false;
  $("adaptation-summary").textContent = "Embedder kept: " + adaptation.kept + ", " + adaptation.steps + " steps, loss " +
    fmt(adaptation.first_loss) + " → " + fmt(adaptation.final_loss) + " (contrastive, on pairs from the documents).";
  const curves = Object.entries(adaptation.loss);
  draw("chart-adaptation", curves.map(([name, points]) => line(name, points)), "Adaptation loss",
    { xaxis: axis("step"), yaxis: axis("loss", { rangemode: "tozero" }) });
  const body = $("candidates-table").querySelector("tbody");
  const candidates = Object.keys(adaptation.candidates).length ? adaptation.candidates : { [adaptation.kept]: {} };
  for (const [name, c] of Object.entries(candidates)) {
    const row = element("tr", name === adaptation.kept ? "chosen" : "");
    cell(row, name);
    if (c.skipped) {
      const why = element("td", "", "not tuned: " + c.skipped); why.colSpan = 5; why.style.textAlign = "left"; row.append(why);
    } else {
      for (const value of [fmt(c["held_out_ndcg@10"]), fmt(c.held_out_pairs), fmt(c.steps), fmt(c.seconds), name === adaptation.kept ? "yes" : ""]) cell(row, value);
    }
    body.append(row);
  }
}

function showSearch(search) {
  $("search").hidden = false;
  const scores = search["ndcg@10"] || {};
  const measured = search.chosen_by === "held-out corpus pairs";
  let said = "Default: " + search.default_mode + (search.default_mode === "hybrid" ? " at dense weight " + fmt(search.dense_weight) : "") + ", chosen on " + search.chosen_by;
  if (search.pairs !== undefined) said += " (" + search.pairs + " pairs from " + search.documents_measured + " documents)";
  if (search.inconclusive) said += "; inconclusive: every mode scored below 0.05, so lexical";
  $("search-summary").textContent = said + ".";
  const modes = MODES.filter(m => scores[m] !== undefined);
  draw("chart-modes", [{ type: "bar", name: "nDCG@10", x: modes, y: modes.map(m => scores[m]) }],
    "nDCG@10 by mode" + (measured ? " on held-out pairs" : " on judged queries"), { yaxis: axis("nDCG@10", { range: [0, 1] }) });
  const weights = search["hybrid_ndcg@10"];
  if (weights) {
    const points = Object.entries(weights).map(([w, s]) => [Number(w), s]).sort((a, b) => a[0] - b[0]);
    const chosen = { type: "line", x0: search.dense_weight, x1: search.dense_weight, yref: "paper", y0: 0, y1: 1, line: { dash: "dot", color: "#888" } };
    draw("chart-weights", [line("hybrid", points)], "Hybrid nDCG@10 by dense weight (dotted: the weight chosen)",
      { xaxis: axis("dense weight", { range: [0, 1] }), yaxis: axis("nDCG@10"), shapes: [chosen] });
  }
}

async function load() {
  const key = urlKey || keyBox.value;
  const response = await fetch("runs.json", { headers: key ? { "X-API-Key": key } : {} });
  const report = await response.json();
  if (!response.ok) {
    show(report.error || ("error " + response.status), true);
    if (response.status === 401) keyForm.hidden = false;
    return;
  }
  keyForm.hidden = true;
  if (report.pretraining) showPretraining(report.pretraining); else $("no-pretraining").hidden = false;
  if (report.adaptation) showAdaptation(report.adaptation); else $("no-adaptation").hidden = false;
  if (report.search) showSearch(report.search); else $("no-search").hidden = false;
  await Promise.all(pending);
  show("");
  document.body.dataset.charts = "drawn";  // every chart has drawn (the browser test waits for this)
}

keyForm.addEventListener("submit", (event) => { event.preventDefault(); load().catch(e => show("The server did not answer: " + e, true)); });
if (urlKey) $("search-link").href = "./?" + new URLSearchParams({ api_key: urlKey });
load().catch(e => show("The page could not be drawn: " + e, true));
