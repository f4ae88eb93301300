// Schedules and the trigger points they handled.
import { allPages, get, seg } from "../api.js";
import { badge, clear, dl, fmtTime, h, json, link, num, shortId, table, timeEl } from "../dom.js";
import { section } from "./common.js";

function when(sc) {
  return sc.cron ? `cron “${sc.cron}” (${sc.timezone})` : `every ${num(sc.interval_seconds)} s`;
}

function misfire(m) {
  if (!m) return "—";
  return typeof m === "string" ? m : Object.entries(m).map(([k, v]) => `${k}: ${v}`).join(", ");
}

export async function schedulesPage(ctx) {
  const { main, signal, query } = ctx;
  const queueId = query.get("queue_id");
  const list = h("div", { id: "schedule-list" });
  clear(main, h("div", { class: "page-head" }, h("h1", {}, "Schedules"),
    queueId ? h("p", { class: "hint" }, "Of one queue. ", link("#/schedules", "Show all.")) : null), section("Schedules", list));
  const names = {};
  await ctx.every(async () => {
    const items = await allPages("/v1/schedules", { queue_id: queueId }, signal);
    await Promise.all([...new Set(items.map((s) => s.queue_id))].filter((id) => !names[id]).map((id) =>
      get(`/v1/queues/${seg(id)}`, null, signal).then((q) => { names[id] = q.name; }).catch(() => { names[id] = id; })));
    clear(list, table(["Schedule", "Queue", "When", "State", "Next trigger", "Last trigger", "Overlap", "Misfire"],
      items.map((sc) => [
        link(`#/schedules/${seg(sc.id)}`, sc.name),
        link(`#/queues/${seg(sc.queue_id)}`, names[sc.queue_id] || sc.queue_id),
        when(sc),
        sc.retired_at ? badge("RETIRED") : sc.paused ? badge("PAUSED") : badge("ACTIVE"),
        sc.next_trigger_at ? [fmtTime(sc.next_trigger_at), " (", timeEl(sc.next_trigger_at), ")"] : "—",
        timeEl(sc.last_trigger_at),
        sc.overlap,
        misfire(sc.misfire),
      ]), { empty: "No schedules." }));
  }, 5000);
}

// Runs are listed oldest first by the API; the page reads up to 10,000 and shows the newest first.
export async function schedulePage(ctx, scheduleId) {
  const { main, signal } = ctx;
  const path = `/v1/schedules/${seg(scheduleId)}`;
  const head = h("div", { class: "page-head" });
  const props = h("div", {});
  const template = h("div", {});
  const runs = h("div", { id: "runs" });
  clear(main, head, h("div", { class: "two" }, section("Schedule", props), section("Task template", template)),
    section("Runs", h("p", { class: "hint" }, "Every trigger point handled, newest first: the task submitted, or why the point was skipped."), runs));
  let cursor = null;
  const all = [];
  await ctx.every(async () => {
    const sc = await get(path, null, signal);
    let queueName = sc.queue_id;
    try { queueName = (await get(`/v1/queues/${seg(sc.queue_id)}`, null, signal)).name; } catch { /* out of scope */ }
    clear(head, h("p", { class: "crumbs" }, link("#/schedules", "Schedules"), " / "), h("h1", {}, sc.name),
      sc.retired_at ? badge("RETIRED") : sc.paused ? badge("PAUSED") : badge("ACTIVE"));
    clear(props, dl([
      ["Queue", link(`#/queues/${seg(sc.queue_id)}`, queueName)],
      ["When", when(sc)],
      ["Starts", fmtTime(sc.start_at)], ["Ends", fmtTime(sc.end_at)],
      ["Next trigger", fmtTime(sc.next_trigger_at)], ["Last trigger", fmtTime(sc.last_trigger_at)],
      ["Misfire", misfire(sc.misfire)], ["Overlap", sc.overlap],
      ["Revision", sc.revision], ["Id", h("code", {}, sc.id)],
    ]));
    clear(template, json(sc.task));
    for (let i = 0; i < 10; i++) {
      const page = await get(`${path}/runs`, { limit: 1000, cursor }, signal);
      all.push(...page.items);
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
    }
    const newest = all.slice(-200).reverse();
    clear(runs, h("p", { class: "hint" }, `${num(all.length)} runs read; the newest ${Math.min(200, all.length)} shown.`),
      table(["Trigger point", "Outcome", "Why skipped", "Task"], newest.map((r) => [
        fmtTime(r.trigger_at), badge(r.outcome), r.reason || "",
        r.task_id ? link(`#/tasks/${seg(r.task_id)}`, shortId(r.task_id), { class: "mono", title: r.task_id }) : "—",
      ]), { empty: "No trigger point handled yet." }));
  }, 5000);
}
