// The event feed, live: starts at the newest events and long-polls for more.
import { call, seg } from "../api.js";
import { clear, field, fmtTime, h, link, shortId } from "../dom.js";
import { errorText, section } from "./common.js";

const TYPES = ["task.submitted", "task.leased", "task.started", "task.retry_scheduled", "task.succeeded", "task.failed",
  "task.cancel_requested", "task.cancelled", "task.needs_review", "task.reviewed", "task.lease_lost", "task.released", "queue.*",
  "schedule.*", "resource_key.*", "application.configured"];
const KEEP = 500;

function target(ev) {
  const id = ev.resource_id;
  if (ev.resource_type === "task") return link(`#/tasks/${seg(id)}`, shortId(id), { class: "mono", title: id });
  if (ev.resource_type === "queue") return link(`#/queues/${seg(id)}`, shortId(id), { class: "mono", title: id });
  if (ev.resource_type === "schedule") return link(`#/schedules/${seg(id)}`, shortId(id), { class: "mono", title: id });
  return h("code", { title: id }, shortId(id));
}

function summary(ev) {
  const d = ev.data || {};
  const t = d.task || {};
  const parts = [];
  if (t.state) parts.push(t.state);
  if (d.attempt) parts.push(`attempt ${d.attempt}`);
  const err = d.error || t.error;
  if (err) parts.push(`${err.code}: ${err.message}`);
  if (d.reason) parts.push(`reason: ${d.reason}`);
  return parts.join(" · ");
}

export async function eventsPage(ctx) {
  const { main, signal, query } = ctx;
  const chosen = new Set((query.get("type") || "").split(",").filter(Boolean));
  const boxes = TYPES.map((t) => h("label", { class: "check" },
    h("input", { type: "checkbox", name: "type", value: t, checked: chosen.has(t) }), t));
  const running = h("button", { type: "button", class: "secondary", id: "feed-toggle", "aria-pressed": "true" }, "Pause feed");
  const state = h("p", { class: "hint", role: "status" });
  const body = h("tbody", {});
  const list = h("table", { class: "grid", id: "event-list" }, h("thead", {}, h("tr", {},
    ["Seq", "Time", "Type", "Resource", "Details"].map((x) => h("th", { scope: "col" }, x)))), body);
  clear(main, h("div", { class: "page-head" }, h("h1", {}, "Events"),
    h("p", { class: "hint" }, "Every state change, in order, as it commits. Newest first.")),
  section("Filter", h("fieldset", { class: "types" }, h("legend", {}, "Types (none checked: all)"), boxes),
    h("div", { class: "toolbar" }, running), state),
  section("Feed", list));
  let paused = false;
  running.addEventListener("click", () => {
    paused = !paused;
    running.textContent = paused ? "Resume feed" : "Pause feed";
    running.setAttribute("aria-pressed", String(!paused));
  });
  for (const b of boxes) b.querySelector("input").addEventListener("change", () => {
    const types = boxes.map((x) => x.querySelector("input")).filter((i) => i.checked).map((i) => i.value);
    history.replaceState(null, "", `#/events${types.length ? `?type=${types.join(",")}` : ""}`);
    restart(types);
  });
  let generation = 0;
  async function restart(types) {
    const mine = ++generation;
    body.replaceChildren();
    let after = null;
    while (!signal.aborted && mine === generation) {
      if (paused) { await new Promise((r) => setTimeout(r, 500)); continue; }
      try {
        const page = await call("GET", "/v1/events", { signal, query: after === null
          ? { tail: true, limit: 200, type: types.length ? types.join(",") : null }
          : { after, limit: 500, wait_ms: 20000, type: types.length ? types.join(",") : null } });
        if (mine !== generation) return;
        after = page.next_after;
        const rows = page.items.map((ev) => h("tr", { dataset: { type: ev.type } },
          h("td", { "data-label": "Seq" }, ev.seq), h("td", { "data-label": "Time" }, fmtTime(ev.time)),
          h("td", { "data-label": "Type" }, h("code", {}, ev.type)), h("td", { "data-label": "Resource" }, target(ev)),
          h("td", { "data-label": "Details" }, summary(ev))));
        body.prepend(...rows.reverse());
        while (body.children.length > KEEP) body.lastChild.remove();
        state.textContent = `Live · read through seq ${after}`;
      } catch (e) {
        if (e.name === "AbortError" || signal.aborted) return;
        state.textContent = `Feed interrupted: ${errorText(e)}; retrying.`;
        if (e.code === "CURSOR_EXPIRED") after = null;
        await new Promise((r) => setTimeout(r, 2000));
      }
    }
  }
  clear(state, "Connecting…");
  restart([...chosen]);
}
