const $ = (id) => document.getElementById(id);
const statusLine = $("status"), results = $("results"), keyBox = $("key"), filtersBox = $("filters"), empty = $("empty");
const urlKey = new URLSearchParams(location.search).get("api_key");
const OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "glob", "contains"];
let fields = {};

function show(message, isError) { statusLine.textContent = message; statusLine.className = isError ? "error" : ""; }
function headers() { const key = urlKey || keyBox.value; return key ? { "X-API-Key": key } : {}; }
function element(tag, className, text) { const e = document.createElement(tag); if (className) e.className = className; if (text !== undefined) e.textContent = text; return e; }
function pageUrl(params) { if (urlKey) params.set("api_key", urlKey); return "?" + params; }

function addFilterRow(field, operator, value) {
  const row = element("div", "filter");
  const fieldSelect = element("select", "filter-field"), opSelect = element("select", "filter-op");
  for (const name of Object.keys(fields)) fieldSelect.append(new Option(name + " (" + fields[name].toLowerCase() + ")", name));
  for (const op of OPERATORS) opSelect.append(new Option(op, op));
  const input = element("input", "filter-value"); input.placeholder = "value (in/nin: a, b, c)";
  const remove = element("button", "filter-remove", "×"); remove.type = "button"; remove.title = "remove this filter";
  remove.onclick = () => row.remove();
  if (field) { if (!(field in fields)) fieldSelect.append(new Option(field, field)); fieldSelect.value = field; }
  opSelect.value = operator || "eq";
  input.value = value === undefined ? "" : (Array.isArray(value) ? value.join(", ") : String(value));
  row.append(fieldSelect, opSelect, input, remove);
  filtersBox.append(row);
}

function typed(field, text) {
  const kind = (fields[field] || "VARCHAR").replace("[]", "");
  if (["BIGINT", "DOUBLE", "INTEGER"].includes(kind) && text.trim() !== "" && !isNaN(Number(text))) return Number(text);
  if (kind === "BOOLEAN" && (text === "true" || text === "false")) return text === "true";
  return text;
}

function currentFilter() {
  const filter = {};
  for (const row of filtersBox.querySelectorAll(".filter")) {
    const field = row.querySelector(".filter-field").value, op = row.querySelector(".filter-op").value;
    const text = row.querySelector(".filter-value").value;
    if (!field || text.trim() === "") continue;
    const value = (op === "in" || op === "nin") ? text.split(",").map(v => typed(field, v.trim())).filter(v => v !== "") : typed(field, text.trim());
    (filter[field] = filter[field] || {})[op] = value;
  }
  return filter;
}

function snippetNode(text, highlights) {
  const p = element("p", "snippet");
  let at = 0;
  for (const [start, end] of highlights) {  // plain text and <mark> elements: nothing is read as HTML
    p.append(document.createTextNode(text.slice(at, start)), element("mark", "", text.slice(start, end)));
    at = end;
  }
  p.append(document.createTextNode(text.slice(at)));
  return p;
}

function fieldsLine(metadata) {
  return Object.entries(metadata || {}).map(([name, value]) => name + ": " + (typeof value === "string" ? value : JSON.stringify(value))).join(" · ");
}

// Each search or document view takes a number; an answer arriving after a newer one started is dropped,
// so two searches in flight (a click while the page loads its address) never show both their results.
let latestView = 0;

async function runSearch(params) {
  const view = ++latestView;
  $("document-view").hidden = true; empty.hidden = true;
  results.replaceChildren();
  const filter = params.get("filter") ? JSON.parse(params.get("filter")) : {};
  const body = { q: params.get("q"), k: Number(params.get("k") || 10), filter };
  if (params.get("mode")) body.mode = params.get("mode");
  show("Searching…");
  try {
    const response = await fetch("search", { method: "POST", headers: { ...headers(), "Content-Type": "application/json" }, body: JSON.stringify(body) });
    const answer = await response.json();
    if (view !== latestView) return;
    if (!response.ok) { show(answer.error || ("error " + response.status), true); return; }
    results.replaceChildren();
    show(answer.results.length + " results (" + answer.mode + ", " + answer.took_ms + " ms)");
    if (!answer.results.length) {
      empty.textContent = Object.keys(filter).length ? "No document matches this query with these filters. Try removing a filter or other words."
                                                     : "No document matches this query. Try other words" + (answer.mode === "lexical" ? ", or the dense or hybrid mode." : ".");
      empty.hidden = false;
    }
    for (const hit of answer.results) {
      const item = element("li", "result");
      const title = element("p", "title");
      const link = element("a", "doc-link", hit.title || hit.doc_id);
      link.href = pageUrl(new URLSearchParams({ doc: hit.doc_id }));
      title.append(link);
      const meta = element("div", "meta", "score " + hit.score.toFixed(4) + " · " + hit.doc_id + " · " + hit.source);
      item.append(title, meta);
      if (Object.keys(hit.metadata).length) item.append(element("div", "fields", fieldsLine(hit.metadata)));
      item.append(snippetNode(hit.snippet, hit.highlights));
      results.append(item);
    }
  } catch (e) {
    if (view === latestView) show("The server did not answer: " + e, true);
  }
}

async function showDocument(docId) {
  const view = ++latestView;
  results.replaceChildren(); empty.hidden = true;
  show("Loading…");
  const response = await fetch("documents/" + encodeURIComponent(docId).replaceAll("%2F", "/"), { headers: headers() });
  const doc = await response.json();
  if (view !== latestView) return;
  if (!response.ok) { show(doc.error || ("error " + response.status), true); return; }
  show("");
  $("document-title").textContent = doc.title || doc.doc_id;
  $("document-meta").textContent = doc.doc_id + " · " + doc.source + " · " + doc.chunks + " chunks";
  $("document-fields").textContent = fieldsLine(doc.metadata);
  $("document").textContent = doc.text;
  $("document-view").hidden = false;
}

function fromUrl(event) {
  const params = new URLSearchParams(location.search);
  // At load (no popstate event) the address is applied once the server's first answers came: words typed
  // meanwhile stay, unless the address holds a query (an empty box would also stop the form: q is required).
  $("q").value = params.get("q") || (event ? "" : $("q").value);
  $("mode").value = params.get("mode") || "";
  $("k").value = params.get("k") || "10";
  filtersBox.replaceChildren();
  let filter = {};
  try { filter = JSON.parse(params.get("filter") || "{}"); } catch (e) { show("The filter in the address is not JSON", true); }
  for (const [field, condition] of Object.entries(filter)) {
    const conditions = (condition && typeof condition === "object" && !Array.isArray(condition)) ? condition : { eq: condition };
    for (const [op, value] of Object.entries(conditions)) addFilterRow(field, op, value);
  }
  if (params.get("doc")) showDocument(params.get("doc"));
  else if (params.get("q")) runSearch(params);
  else { latestView++; results.replaceChildren(); $("document-view").hidden = true; empty.hidden = true; show(""); }
}

async function loadFields() {
  const response = await fetch("fields", { headers: headers() });
  if (response.ok) fields = (await response.json()).fields;
}

$("search-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!Object.keys(fields).length && keyBox.value) loadFields();  // the key was typed after the page loaded
  const params = new URLSearchParams({ q: $("q").value, k: $("k").value });
  if ($("mode").value) params.set("mode", $("mode").value);
  const filter = currentFilter();
  if (Object.keys(filter).length) params.set("filter", JSON.stringify(filter));
  history.pushState(null, "", pageUrl(params));  // the address holds the search: back button, sharing
  runSearch(params);
});
$("add-filter").addEventListener("click", () => addFilterRow());
$("home").href = pageUrl(new URLSearchParams());
if (urlKey) $("runs-link").href = "runs" + pageUrl(new URLSearchParams());
window.addEventListener("popstate", fromUrl);

fetch("health").then(r => r.json()).then(async (h) => {
  $("default-mode").textContent = "default (" + h.default_mode + ")";
  if (h.auth && !urlKey) keyBox.hidden = false;
  await loadFields();
  fromUrl();
  document.body.dataset.ready = "true";  // the address applied (the browser tests wait for it)
});
