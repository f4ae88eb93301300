// Queues: the overview with live counts and recent failures, and one queue's page.
import { get, post, seg, session } from "../api.js";
import { throughputChart } from "../chart.js";
import { badge, clear, dl, field, h, link, meter, num, shortId, table, timeEl } from "../dom.js";
import { Pager, conflictText, errorText, notice, reasonForm, section } from "./common.js";
import { blockerShort } from "./task.js";

export const STATES = ["WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW", "SUCCEEDED", "FAILED", "CANCELLED"];
const STATE_LABEL = { NEEDS_REVIEW: "Needs review" };

function queueState(q) {
  if (q.retired_at) return h("span", { class: "badge state-retired" }, "Retired");
  return q.paused ? h("span", { class: "badge state-paused" }, "Paused") : h("span", { class: "badge state-active" }, "Active");
}

function rateUsed(usage) {
  return usage && usage.rate_window ? Number(usage.rate_window.used) + Number(usage.rate_window.reserved || 0) : 0;
}

const PAGE = 50;

export async function queuesPage(ctx) {
  const { main, signal, query } = ctx;
  const list = h("div", { id: "queue-list" });
  const failures = h("div", { id: "recent-failures" });
  const name = h("input", { type: "search", id: "queue-name", name: "name", value: query.get("name") || "",
    autocomplete: "off", placeholder: "exact name" });
  const find = h("form", { class: "toolbar", role: "search", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = name.value.trim() ? `#/queues?name=${encodeURIComponent(name.value.trim())}` : "#/queues";
  } }, field("Find a queue", name), h("button", { type: "submit", class: "secondary" }, "Find"));
  const pager = new Pager(() => refresh());
  clear(main,
    h("div", { class: "page-head" }, h("h1", {}, "Queues"),
      h("p", { class: "hint" }, "Live counts from every node; refreshed every 3 seconds.")),
    section("All queues", find, list, pager.el),
    section("Recent failures", h("p", { class: "hint" }, "The newest tasks that ended FAILED, across the queues on this page (up to 20)."), failures));
  if (!session.allQueues) {
    clear(list, h("p", {}, "This token is scoped to single queues: "),
      h("ul", {}, session.credential.queue_scope.map((id) => h("li", {}, link(`#/queues/${seg(id)}`, id)))));
    pager.el.hidden = true;
    return;
  }
  let queues = [];
  async function refresh() {
    const page = await get("/v1/queues", { limit: PAGE, cursor: pager.cursor, name: query.get("name") }, signal);
    queues = page.items;
    const usages = await Promise.all(queues.map((q) =>
      get(`/v1/queues/${seg(q.id)}/usage`, null, signal).catch(() => null)));
    const rows = queues.map((q, i) => {
      const u = usages[i];
      return [
        h("span", { class: "name" }, link(`#/queues/${seg(q.id)}`, q.name, { "data-queue": q.name })),
        queueState(q),
        meter(q.unfinished_tasks, q.max_unfinished_tasks, `backlog of ${q.name}`),
        u ? num(u.waiting) : "—",
        u ? num(u.delayed) : "—",
        u ? num(u.leased) : "—",
        u ? num(u.running) : "—",
        u ? h("span", { class: Number(u.needs_review) ? "warn" : null }, num(u.needs_review)) : "—",
        meter(u ? u.in_flight : 0, q.max_concurrency, `permits of ${q.name}`),
        meter(rateUsed(u), q.rate_per_second, `rate window of ${q.name}`),
      ];
    });
    clear(list, table(["Queue", "State", "Backlog", "Waiting", "Delayed", "Leased", "Running", "Needs review",
      "Permits in use", "Rate (this second)"], rows, { empty: query.get("name") ? "No queue has this name." : "No queues yet." }));
    pager.render(page.next_cursor);
  }
  await ctx.every(refresh, 3000);
  ctx.every(async () => {
    const perQueue = await Promise.all(queues.slice(0, 20).map((q) =>
      get(`/v1/queues/${seg(q.id)}/tasks`, { state: "FAILED", limit: 5 }, signal)
        .then((p) => p.items.map((t) => ({ t, q }))).catch(() => [])));
    const items = perQueue.flat().sort((a, b) => String(b.t.finished_at || b.t.updated_at)
      .localeCompare(String(a.t.finished_at || a.t.updated_at))).slice(0, 10);
    clear(failures, table(["Task", "Queue", "Error", "Ended"], items.map(({ t, q }) => [
      link(`#/tasks/${seg(t.id)}`, shortId(t.id), { class: "mono", title: t.id }),
      link(`#/queues/${seg(q.id)}`, q.name),
      t.error ? h("span", { class: "error-text" }, h("strong", {}, t.error.code), " ", t.error.message) : "—",
      timeEl(t.finished_at || t.updated_at),
    ]), { empty: "No failed tasks." }));
  }, 5000);
}

export async function queuePage(ctx, queueId) {
  const { main, signal, query } = ctx;
  const qpath = `/v1/queues/${seg(queueId)}`;
  let queue = await get(qpath, null, signal);
  const title = h("h1", {}, queue.name);
  const stateEl = h("span", {});
  const counts = h("div", { class: "counts", id: "queue-counts" });
  const nodes = h("div", {});
  const chart = h("div", { id: "throughput" });
  const windowSel = h("select", { id: "chart-window", name: "minutes" },
    [5, 10, 30, 60].map((m) => h("option", { value: m, selected: m === 10 }, `last ${m} minutes`)));
  windowSel.addEventListener("change", () => refreshChart().catch(() => {}));
  const props = h("div", {});
  const controls = h("div", { id: "controls" });
  const tasks = h("div", { id: "task-list" });
  const stateSel = h("select", { id: "state-filter", name: "state" },
    h("option", { value: "" }, "All states"),
    STATES.map((st) => h("option", { value: st, selected: query.get("state") === st }, STATE_LABEL[st] || st)));
  const pager = new Pager(() => loadTasks());

  clear(main,
    h("div", { class: "page-head" }, h("p", { class: "crumbs" }, link("#/queues", "Queues"), " / "), title, stateEl),
    section("Now", counts, nodes),
    section("Throughput", h("div", { class: "toolbar" }, field("Window", windowSel)), chart),
    h("div", { class: "two" }, section("Controls", props), section("Change", controls)),
    section("Tasks", h("div", { class: "toolbar" }, field("State", stateSel),
      link(`#/schedules?queue_id=${seg(queueId)}`, "Schedules of this queue"),
      session.can("audit:read") ? link(`#/audit?resource_id=${seg(queueId)}`, "Audit log of this queue") : null),
    tasks, pager.el));

  function renderQueue() {
    clear(stateEl, queueState(queue));
    clear(props, dl([
      ["Paused", queue.paused ? "yes" : "no"],
      ["Max concurrency", num(queue.max_concurrency)],
      ["Rate per second", num(queue.rate_per_second)],
      ["Max unfinished tasks", num(queue.max_unfinished_tasks)],
      ["Revision", queue.revision],
      ["Updated", timeEl(queue.updated_at)],
      ["Created", timeEl(queue.created_at)],
      ["Id", h("code", {}, queue.id)],
    ]));
  }

  async function refreshNow() {
    const [q, u] = await Promise.all([get(qpath, null, signal), get(`${qpath}/usage`, null, signal)]);
    const changed = q.revision !== queue.revision;
    queue = q;
    if (changed) { renderQueue(); markStale(); }
    clear(stateEl, queueState(queue));
    // A count of tasks in a state opens the task list filtered to that state.
    const STATE_OF = { waiting: "WAITING", leased: "LEASED", running: "RUNNING", needs_review: "NEEDS_REVIEW" };
    const card = (label, value, key, cls) => h("div", { class: `count ${value instanceof Node ? "wide" : ""} ${cls || ""}`, dataset: { count: key } },
      h("div", { class: "count-label" }, STATE_OF[key]
        ? link(`#/queues/${seg(queueId)}?state=${STATE_OF[key]}`, label, { title: `List the ${label.toLowerCase()} tasks` }) : label),
      h("div", { class: "count-value" }, value));
    clear(counts,
      card("Backlog", meter(u.unfinished_tasks, queue.max_unfinished_tasks, "backlog"), "backlog"),
      card("Waiting", num(u.waiting), "waiting"),
      card("Delayed", num(u.delayed), "delayed"),
      card("Leased", num(u.leased), "leased"),
      card("Running", num(u.running), "running"),
      card("Needs review", num(u.needs_review), "needs_review", Number(u.needs_review) ? "warn" : ""),
      card("Permits in use", meter(u.in_flight, queue.max_concurrency, "permits in use"), "in_flight"),
      card("Rate, this second", meter(rateUsed(u), queue.rate_per_second, "rate window"), "rate"));
    clear(nodes, h("h3", {}, "Worker nodes active on this queue"), table(["Node", "Permits held", "Last claim"],
      u.active_nodes.map((n) => [h("code", {}, n.node_id), num(n.in_flight), timeEl(n.last_claim_at)]),
      { empty: "No worker node claimed on this queue in the last 10 seconds." }));
  }

  async function refreshChart() {
    let data;
    try {
      data = await get(`${qpath}/throughput`, { minutes: windowSel.value }, signal);
    } catch (e) {
      if (e.name === "AbortError") throw e;
      clear(chart, h("p", { class: "hint" }, `No throughput data: ${errorText(e)}`));
      return;
    }
    clear(chart, throughputChart(data, chart.clientWidth || 640));
  }

  // A change made elsewhere never rewrites the form under the user: it says so, and offers the new values.
  const staleNote = h("div", { id: "stale-note", role: "status" });
  function markStale() {
    if (!formRevision || formRevision === queue.revision) { clear(staleNote); return; }
    clear(staleNote, h("p", { class: "notice warn" }, `This queue is now at revision ${queue.revision}; `
      + `the forms below were opened at revision ${formRevision}. `,
    h("button", { type: "button", class: "secondary", id: "reload-forms", onclick: renderControls }, "Load current values")));
  }
  let formRevision = null;

  function renderControls() {
    formRevision = queue.revision;
    clear(staleNote);
    if (!session.can("queues:manage") || queue.retired_at) {
      clear(controls, h("p", { class: "hint" }, queue.retired_at ? "A retired queue cannot change."
        : "This token cannot change queues (it lacks queues:manage)."));
      return;
    }
    const limits = queue; // the values and revision this form edits
    const pause = reasonForm({
      id: "pause-form", title: queue.paused ? "Resume the queue" : "Pause the queue",
      button: queue.paused ? "Resume" : "Pause", danger: !queue.paused,
      describe: queue.paused ? "Workers may claim and start its tasks again." :
        "No new claim or Start in this queue; running attempts finish.",
      onSubmit: async (reason) => {
        const r = await post(`${qpath}:configure`, { expected_revision: limits.revision, reason, paused: !limits.paused,
          max_concurrency: limits.max_concurrency, rate_per_second: limits.rate_per_second,
          max_unfinished_tasks: limits.max_unfinished_tasks });
        queue = r.queue || queue;
        renderQueue(); renderControls();
        await refreshNow().catch(() => {});
        notice(document.getElementById("pause-form-result"), "ok", limits.paused ? "Resumed." : "Paused.");
        return limits.paused ? "Resumed." : "Paused.";
      },
    });
    const numberInput = (name, value, min, max) => h("input", { type: "number", name, id: `limit-${name}`, value,
      min, max, required: true, inputmode: "numeric" });
    const mc = numberInput("max_concurrency", limits.max_concurrency, 1, 100000);
    const rps = numberInput("rate_per_second", limits.rate_per_second, 1, 1000000);
    const mu = numberInput("max_unfinished_tasks", limits.max_unfinished_tasks, 1, 1000000);
    const configure = reasonForm({
      id: "limits-form", title: "Limits", button: "Save limits",
      describe: `Editing revision ${limits.revision}. If the queue changed since, nothing is overwritten.`,
      extra: [field("Max concurrency", mc), field("Rate per second", rps), field("Max unfinished tasks", mu)],
      onSubmit: async (reason) => {
        try {
          const r = await post(`${qpath}:configure`, { expected_revision: limits.revision, reason, paused: limits.paused,
            max_concurrency: Number(mc.value), rate_per_second: Number(rps.value), max_unfinished_tasks: Number(mu.value) });
          queue = r.queue || queue;
        } catch (e) {
          await refreshNow().catch(() => {});
          throw e;
        }
        renderQueue(); renderControls();
        await refreshNow().catch(() => {});
        notice(document.getElementById("limits-form-result"), "ok", "Saved.");
        return "Saved.";
      },
    });
    clear(controls, staleNote, pause, configure);
  }

  async function loadTasks() {
    const state = stateSel.value;
    const page = await get(`${qpath}/tasks`, { state: state || null, limit: 25, cursor: pager.cursor }, signal);
    // What holds each waiting task in view: the answer operators otherwise have to work out.
    const held = await Promise.all(page.items.map((t) => t.state === "WAITING"
      ? get(`/v1/tasks/${seg(t.id)}/blockers`, null, signal).then((b) => b.blockers).catch(() => null) : null));
    clear(tasks, table(["Task", "State", "Held by", "Attempts", "Priority", "Created", "Updated", "Error"], page.items.map((t, i) => [
      link(`#/tasks/${seg(t.id)}`, shortId(t.id), { class: "mono", title: t.id }),
      badge(t.state),
      held[i] === null ? "" : held[i].length ? h("span", { class: "held" }, held[i].map(blockerShort).join("; ")) : h("span", { class: "muted" }, "nothing: next claim"),
      `${t.attempts} / ${t.max_attempts}`,
      String(t.priority),
      timeEl(t.created_at),
      timeEl(t.updated_at),
      t.error ? h("span", { class: "error-text" }, h("strong", {}, t.error.code), " ", t.error.message) : "",
    ]), { empty: state ? `No ${state} tasks.` : "No tasks in this queue." }));
    pager.render(page.next_cursor);
  }
  stateSel.addEventListener("change", () => {
    pager.reset();
    ctx.query.set("state", stateSel.value);
    history.replaceState(null, "", `#/queues/${seg(queueId)}${stateSel.value ? `?state=${stateSel.value}` : ""}`);
    loadTasks().catch((e) => clear(tasks, h("p", { class: "error" }, errorText(e))));
  });

  renderQueue();
  renderControls();
  await ctx.every(refreshNow, 2000);
  ctx.every(refreshChart, 5000);
  ctx.every(loadTasks, 5000);
}

export { conflictText, notice };
