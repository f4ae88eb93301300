// A throughput chart drawn as SVG: started, succeeded and failed per second.
import { h, s, num } from "./dom.js";

const SERIES = [
  ["started", "Started"],
  ["succeeded", "Succeeded"],
  ["failed", "Failed"],
];

function niceMax(v) {
  if (v <= 1) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// `width`: the pixels it will be drawn in, so that its text keeps its size on a phone.
export function throughputChart(data, width = 640) {
  const W = Math.max(280, Math.round(width)), H = W < 500 ? 160 : 200, L = 44, R = 8, T = 10, B = 24;
  const points = data.points || [];
  const step = Number(data.interval_seconds) || 5;
  // The last bucket is still running: its rate is over the seconds it has had so far.
  const elapsed = points.length && data.at ? (new Date(data.at) - new Date(points[points.length - 1].at)) / 1000 : step;
  const span = (i) => (i === points.length - 1 ? Math.min(step, Math.max(1, elapsed)) : step);
  const rates = points.map((p, i) => Object.fromEntries(SERIES.map(([k]) => [k, Number(p[k] || 0) / span(i)])));
  const max = niceMax(Math.max(0, ...rates.flatMap((r) => SERIES.map(([k]) => r[k]))));
  const n = Math.max(points.length - 1, 1);
  const x = (i) => L + ((W - L - R) * i) / n;
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const last = rates[rates.length - 1] || { started: 0, succeeded: 0, failed: 0 };
  const minutes = Math.round((points.length * step) / 60);
  const summary = `Last ${minutes} minutes, per second now: ` +
    SERIES.map(([k, label]) => `${label.toLowerCase()} ${last[k].toFixed(1)}`).join(", ");
  const grid = [0, 0.5, 1].map((f) => {
    const v = max * f;
    return [s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid-line" }),
      s("text", { x: L - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, num(Number(v.toFixed(1))))];
  });
  const ticks = points.length > 1 ? [0, Math.floor(n / 2), n].map((i) => {
    const secs = Math.round((n - i) * step);
    const label = secs === 0 ? "now" : secs >= 60 ? `−${Math.round(secs / 60)}m` : `−${secs}s`;
    return s("text", { x: x(i), y: H - 6, class: "axis", "text-anchor": i === 0 ? "start" : i === n ? "end" : "middle" }, label);
  }) : [];
  const lines = SERIES.map(([k]) => s("polyline", {
    class: `series series-${k}`, fill: "none",
    points: rates.map((r, i) => `${x(i).toFixed(1)},${y(r[k]).toFixed(1)}`).join(" "),
  }));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": summary },
    s("title", {}, summary), grid, ticks, lines);
  const legend = h("ul", { class: "legend" }, SERIES.map(([k, label]) =>
    h("li", { class: `key-${k}` }, h("span", { class: "swatch", "aria-hidden": "true" }), `${label} `,
      h("strong", { dataset: { series: k } }, `${last[k].toFixed(1)}/s`))));
  const totals = data.totals ? h("p", { class: "hint" },
    `Totals since the queue's counters began: started ${num(data.totals.started)}, ` +
    `succeeded ${num(data.totals.succeeded)}, failed ${num(data.totals.failed)}.`) : null;
  return h("figure", { class: "throughput" }, svg, h("figcaption", {}, legend, totals));
}
