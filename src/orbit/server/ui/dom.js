// Building the page from data: every value from the API becomes a text node, never markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

const SVG = "http://www.w3.org/2000/svg";
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleString(undefined, { hour12: false, year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function ago(iso, now = Date.now()) {
  if (!iso) return "—";
  const secs = Math.round((now - new Date(iso).getTime()) / 1000);
  const abs = Math.abs(secs);
  const text = abs < 60 ? `${abs}s` : abs < 3600 ? `${Math.floor(abs / 60)}m` : abs < 86400
    ? `${Math.floor(abs / 3600)}h` : `${Math.floor(abs / 86400)}d`;
  return secs >= 0 ? `${text} ago` : `in ${text}`;
}

export function timeEl(iso) {
  return iso ? h("time", { datetime: iso, title: fmtTime(iso) }, ago(iso)) : h("span", { class: "muted" }, "—");
}

export function num(v) {
  if (v === null || v === undefined || v === "") return "—";
  const n = Number(v);
  return Number.isFinite(n) ? n.toLocaleString("en-US") : String(v);
}

export function json(value) {
  return h("pre", { class: "json" }, value === undefined ? "—" : JSON.stringify(value, null, 2));
}

export function badge(state) {
  return h("span", { class: `badge state-${String(state || "").toLowerCase()}` }, state || "—");
}

export function meter(used, limit, label) {
  const u = Number(used) || 0, l = Number(limit) || 0;
  const pct = l > 0 ? Math.min(100, (u / l) * 100) : 0;
  const cls = pct >= 100 ? "full" : pct >= 80 ? "high" : "";
  // The page's Content-Security-Policy refuses style attributes; the CSSOM is allowed.
  const fill = h("div", { class: "meter-fill" });
  fill.style.width = `${pct.toFixed(1)}%`;
  return h("div", { class: `meter ${cls}`, role: "meter", "aria-label": label, "aria-valuemin": 0,
      "aria-valuemax": l, "aria-valuenow": u },
    h("div", { class: "meter-bar" }, fill),
    h("span", { class: "meter-text" }, `${num(u)} / ${num(l)}`));
}

export function field(label, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), input,
    hint ? h("div", { class: "hint" }, hint) : null);
}

export function dl(pairs) {
  return h("dl", { class: "props" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

// Rows are arrays of cells; on a phone each row becomes a card and each cell names its column.
export function table(headers, rows, { empty = "Nothing here yet.", caption, rowClass } = {}) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", { class: "grid" },
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows.map((cells, i) => h("tr", { class: rowClass ? rowClass(i) : null },
      cells.map((c, j) => h("td", { "data-label": headers[j] }, c))))));
}

export function link(href, text, attrs = {}) {
  return h("a", { href, ...attrs }, text);
}

export function shortId(id) {
  return id ? `${String(id).slice(0, 8)}…${String(id).slice(-4)}` : "—";
}
