// The audit log: every management operation, who did it and why.
import { get, seg } from "../api.js";
import { clear, field, fmtTime, h, json, link, table } from "../dom.js";
import { section } from "./common.js";

function resource(r) {
  const id = r.resource_id;
  const href = { queue: "#/queues/", task: "#/tasks/", schedule: "#/schedules/" }[r.resource_type];
  return href ? link(`${href}${seg(id)}`, `${r.resource_type} ${id}`) : `${r.resource_type} ${id}`;
}

export async function auditPage(ctx) {
  const { main, signal, query } = ctx;
  const rid = h("input", { type: "text", id: "audit-resource", name: "resource_id", value: query.get("resource_id") || "", autocomplete: "off" });
  const action = h("input", { type: "text", id: "audit-action", name: "action", value: query.get("action") || "",
    placeholder: "e.g. queue.configure", autocomplete: "off" });
  const list = h("div", { id: "audit-list" });
  const form = h("form", { class: "toolbar", role: "search", onsubmit: (ev) => {
    ev.preventDefault();
    const qs = new URLSearchParams(Object.entries({ resource_id: rid.value.trim(), action: action.value.trim() }).filter(([, v]) => v));
    location.hash = `#/audit${qs.toString() ? `?${qs}` : ""}`;
  } }, field("Resource id", rid), field("Action", action), h("button", { type: "submit" }, "Filter"));
  clear(main, h("div", { class: "page-head" }, h("h1", {}, "Audit log"),
    h("p", { class: "hint" }, "Management operations of this namespace, oldest first, with their reason and the values before and after.")),
  section("Filter", form), section("Records", list));
  const items = [];
  let after = null;
  // The API lists oldest first from a cursor: read to the end (up to 20,000 records), show the newest first.
  let shown = -1;
  async function load() {
    for (let pages = 0; pages < 20; pages++) {
      const page = await get("/v1/audit-records", { resource_id: rid.value.trim() || null, action: action.value.trim() || null,
        after, limit: 1000 }, signal);
      items.push(...page.items);
      after = page.next_after || after;
      if (page.items.length < 1000) break;
    }
    if (items.length === shown) return; // nothing new: keep what the reader opened
    shown = items.length;
    clear(list, table(["Time", "Action", "Resource", "Reason", "Actor", "Change"], items.slice(-500).reverse().map((r) => [
      fmtTime(r.time), h("code", {}, r.action), resource(r), r.reason || "—",
      r.actor_credential_id ? h("code", { title: "credential" }, r.actor_credential_id) : (r.actor || "—"),
      h("details", {}, h("summary", {}, "before / after"), h("div", { class: "two" }, json(r.before), json(r.after))),
    ]), { empty: "No audit record matches." }));
  }
  await ctx.every(load, 5000);
}
