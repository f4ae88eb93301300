// One task: its error first, why it waits, its attempts as a timeline, and the cancel and review actions.
import { get, post, seg, session } from "../api.js";
import { badge, clear, dl, field, fmtTime, h, json, link, num, timeEl } from "../dom.js";
import { errorText, reasonForm, section } from "./common.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const LAYER = { time: "Time", queue: "Queue", application: "Application", resource_key: "Resource key",
  fairness: "Node fairness", workers: "Workers" };

// One blocker as a sentence a person reads at a glance.
export function blockerText(b) {
  const who = b.layer === "resource_key" ? `Resource key “${b.name}”` : LAYER[b.layer] || b.layer;
  switch (b.control) {
    case "available_at": return `${who}: not due until ${fmtTime(b.until)}.`;
    case "paused": return `${who} is paused.`;
    case "retired": return `${who} is retired.`;
    case "max_concurrency": return `${who} concurrency: ${num(b.in_use)} of ${num(b.limit)} permits in use.`;
    case "rate_per_second": return `${who} rate: ${num(b.used)} of ${num(b.limit)} Starts this second` +
      (b.until ? `, next window at ${fmtTime(b.until)}.` : ".");
    case "no_active_workers": return "Workers: no worker session claimed on this queue in the last 10 seconds.";
    default: return `${who}: ${b.control}` + (b.limit !== null && b.limit !== undefined ? ` (limit ${num(b.limit)})` : "");
  }
}

// The same, in a few words, for a column of a task list.
export function blockerShort(b) {
  const who = b.layer === "resource_key" ? `key ${b.name}` : b.layer === "application" ? "application" : b.layer;
  switch (b.control) {
    case "available_at": return `not due until ${fmtTime(b.until)}`;
    case "paused": return `${who} paused`;
    case "retired": return `${who} retired`;
    case "max_concurrency": return `${who} concurrency ${num(b.in_use)}/${num(b.limit)}`;
    case "rate_per_second": return `${who} rate ${num(b.used)}/${num(b.limit)} per second`;
    case "no_active_workers": return "no worker";
    default: return `${who} ${b.control}`;
  }
}

function duration(from, to) {
  if (!from || !to) return null;
  const ms = new Date(to) - new Date(from);
  return ms < 1000 ? `${ms} ms` : ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : `${(ms / 60000).toFixed(1)} min`;
}

function attemptItem(a) {
  const ran = duration(a.started_at, a.ended_at);
  return h("li", { class: `attempt outcome-${String(a.outcome).toLowerCase()}`, dataset: { attempt: a.number } },
    h("div", { class: "attempt-head" }, h("strong", {}, `Attempt ${a.number}`), " ", badge(a.outcome),
      ran ? h("span", { class: "muted" }, ` ran ${ran}`) : null),
    dl([
      ["Worker node", a.node_id ? h("code", {}, a.node_id) : "—"],
      ["Session", a.worker_session_id ? h("code", {}, a.worker_session_id) : "—"],
      a.lease_id ? ["Lease", h("code", {}, a.lease_id)] : null,
      ["Leased", a.leased_at ? fmtTime(a.leased_at) : "—"],
      a.outcome === "RUNNING" && a.lease_expires_at ? ["Lease expires", fmtTime(a.lease_expires_at)] : null,
      ["Started", a.started_at ? fmtTime(a.started_at) : "never started"],
      ["Ended", a.ended_at ? fmtTime(a.ended_at) : "—"],
    ]),
    a.error ? h("div", { class: "error-box" }, h("strong", {}, a.error.code), " ", a.error.message) : null,
    a.late_reports && a.late_reports.length ? h("div", { class: "late" },
      h("h4", {}, "Late reports (arrived after the lease was lost; changed nothing)"),
      h("ul", {}, a.late_reports.map((r) => h("li", {}, `${fmtTime(r.received_at)}: ${r.outcome}`,
        r.error ? ` — ${r.error}` : "", r.result !== undefined && r.result !== null ? [" result ", json(r.result)] : null)))) : null);
}

export async function taskPage(ctx, taskId) {
  const { main, signal } = ctx;
  const path = `/v1/tasks/${seg(taskId)}`;
  let task = await get(path, null, signal);
  const head = h("div", { class: "page-head" });
  const errorEl = h("div", { id: "task-error" });
  const why = h("div", { id: "blockers" });
  const props = h("div", {});
  const payload = h("div", { id: "payload" });
  const result = h("div", { id: "result" });
  const attempts = h("ol", { class: "timeline", id: "attempts" });
  const actions = h("div", { id: "actions" });
  const audit = h("div", { id: "task-audit" });
  let queueName = task.queue_id;
  try { queueName = (await get(`/v1/queues/${seg(task.queue_id)}`, null, signal)).name; } catch { /* out of scope */ }
  const whySection = section("Why it waits", why);
  whySection.id = "why";
  clear(main, head, errorEl, whySection,
    h("div", { class: "two" }, section("Task", props), section("Actions", actions)),
    section("Attempts", attempts),
    h("div", { class: "two" }, section("Payload", payload), section("Result", result)),
    session.can("audit:read") ? section("Audit log", audit) : null);

  let actionsFor = null;
  function render() {
    clear(head, h("p", { class: "crumbs" }, link("#/queues", "Queues"), " / ",
      link(`#/queues/${seg(task.queue_id)}`, queueName), " / "),
    h("h1", {}, "Task ", h("code", { class: "task-id" }, task.id)), badge(task.state),
    task.cancel_requested && !TERMINAL.has(task.state) ? h("span", { class: "badge state-warn" }, "cancel requested") : null);
    clear(errorEl, task.error ? h("div", { class: "error-box big", role: "alert" },
      h("div", { class: "error-code" }, task.error.code), h("div", { class: "error-message" }, task.error.message)) : null);
    clear(props, dl([
      ["State", badge(task.state)],
      ["Attempts", `${task.attempts} of ${task.max_attempts}`],
      ["Priority", String(task.priority)],
      ["Resource keys", task.resource_keys.length ? task.resource_keys.join(", ") : "none"],
      ["Available at", fmtTime(task.available_at)],
      ["Start deadline", fmtTime(task.start_deadline_at)],
      ["Deadline", fmtTime(task.deadline_at)],
      ["On lease lost", task.on_lease_lost],
      ["Retry", `initial ${task.retry.initial_backoff_ms} ms × ${task.retry.multiplier}, at most ${task.retry.max_backoff_ms} ms`],
      task.schedule_id ? ["Schedule", [link(`#/schedules/${seg(task.schedule_id)}`, task.schedule_id), " at ", fmtTime(task.trigger_at)]] : null,
      ["Created", [fmtTime(task.created_at), " (", timeEl(task.created_at), ")"]],
      ["Updated", fmtTime(task.updated_at)],
      ["Finished", fmtTime(task.finished_at)],
    ]));
    clear(payload, json(task.payload));
    clear(result, task.result === null || task.result === undefined ? h("p", { class: "hint" }, "No result.") : json(task.result));
    const key = `${task.state}/${task.cancel_requested}`;
    if (key !== actionsFor) { actionsFor = key; renderActions(); }
  }

  function renderActions() {
    const forms = [];
    if (["WAITING", "LEASED", "RUNNING"].includes(task.state) && !task.cancel_requested) {
      forms.push(session.can("tasks:cancel") ? reasonForm({ id: "cancel-form", title: "Cancel", button: "Cancel task", danger: true,
        describe: task.state === "RUNNING" ? "The worker is told at once; the task ends when it acknowledges." : "The task ends CANCELLED now.",
        onSubmit: async (reason) => { task = (await post(`${path}:cancel`, { reason })).task; render(); return "Cancel accepted."; } })
        : h("p", { class: "hint" }, "This token cannot cancel tasks."));
    }
    if (task.state === "NEEDS_REVIEW") {
      const resolution = h("select", { id: "review-resolution", name: "resolution" },
        ["SUCCEEDED", "FAILED", "RETRY"].map((r) => h("option", { value: r }, r)));
      forms.push(session.can("tasks:review") ? reasonForm({ id: "review-form", title: "Review", button: "Resolve",
        describe: "The last attempt's outcome is unknown: decide it. SUCCEEDED and FAILED end the task; RETRY runs it again.",
        extra: [field("Resolution", resolution)],
        onSubmit: async (reason) => { task = (await post(`${path}:review`, { resolution: resolution.value, reason })).task; render(); return "Resolved."; } })
        : h("p", { class: "hint" }, "This token cannot review tasks."));
    }
    clear(actions, forms.length ? forms : h("p", { class: "hint" }, TERMINAL.has(task.state) ? `The task ended ${task.state}; nothing to do.` : "No action applies now."));
  }

  async function refresh() {
    task = await get(path, null, signal);
    const [att, blk] = await Promise.all([
      get(`${path}/attempts`, { limit: 1000 }, signal),
      task.state === "WAITING" ? get(`${path}/blockers`, null, signal) : Promise.resolve(null),
    ]);
    render();
    clear(attempts, att.items.length ? att.items.map(attemptItem) : h("li", { class: "hint" }, "No attempt yet."));
    whySection.hidden = TERMINAL.has(task.state);
    if (task.state !== "WAITING") {
      clear(why, h("p", {}, TERMINAL.has(task.state) ? `It does not wait: it ended ${task.state}.`
        : task.state === "NEEDS_REVIEW" ? "It waits for a person: its last attempt's outcome is unknown. Review it."
          : `It does not wait: it is ${task.state}.`));
    } else if (!blk.blockers.length) {
      clear(why, h("p", {}, "Nothing holds it: the next claim on its queue can take it."));
    } else {
      clear(why, h("ul", { class: "blockers" }, blk.blockers.map((b) =>
        h("li", { dataset: { layer: b.layer, control: b.control } }, blockerText(b)))));
    }
    if (session.can("audit:read")) {
      const recs = await get("/v1/audit-records", { resource_id: task.id, limit: 100 }, signal);
      clear(audit, recs.items.length ? h("ul", { class: "plain" }, recs.items.map((r) => h("li", {},
        `${fmtTime(r.time)} — ${r.action}`, r.reason ? ` — “${r.reason}”` : "", r.actor ? ` (by ${r.actor})` : "")))
        : h("p", { class: "hint" }, "No management action on this task."));
    }
  }
  await ctx.every(refresh, 3000);
}

export { errorText };
