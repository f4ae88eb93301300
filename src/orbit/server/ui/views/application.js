// The application's quotas, shared by all its queues, with their live use.
import { get, post, seg, session } from "../api.js";
import { clear, dl, field, h, meter, num, timeEl } from "../dom.js";
import { reasonForm, section } from "./common.js";

export async function applicationPage(ctx) {
  const { main, signal } = ctx;
  const path = `/v1/applications/${seg(session.credential.application_id)}`;
  const head = h("div", { class: "page-head" });
  const use = h("div", { class: "counts" });
  const props = h("div", {});
  const change = h("div", {});
  clear(main, head, section("Use", use), h("div", { class: "two" }, section("Quotas", props), section("Change", change)));
  let app = null;
  let formRevision = null;
  function renderForm() {
    formRevision = app.revision;
    if (!session.can("applications:manage")) {
      clear(change, h("p", { class: "hint" }, "This token cannot change the application's quotas."));
      return;
    }
    const input = (name, value, max) => h("input", { type: "number", name, id: `app-${name}`, value, min: 1, max, required: true });
    const paused = h("select", { id: "app-paused", name: "paused" }, h("option", { value: "false", selected: !app.paused }, "running"),
      h("option", { value: "true", selected: app.paused }, "paused"));
    const mc = input("max_concurrency", app.max_concurrency, 1000000);
    const rps = input("rate_per_second", app.rate_per_second, 10000000);
    const mu = input("max_unfinished_tasks", app.max_unfinished_tasks, 100000000);
    const edited = app;
    clear(change, reasonForm({ id: "app-form", title: "Quotas", button: "Save quotas",
      describe: `Editing revision ${edited.revision}; a change made meanwhile is never overwritten.`,
      extra: [field("State", paused), field("Max concurrency", mc), field("Rate per second", rps), field("Max unfinished tasks", mu)],
      onSubmit: async (reason) => {
        await post(`${path}:configure`, { expected_revision: edited.revision, reason, paused: paused.value === "true",
          max_concurrency: Number(mc.value), rate_per_second: Number(rps.value), max_unfinished_tasks: Number(mu.value) });
        app = await get(path, null, signal);
        render(); renderForm();
        return "Saved.";
      } }));
  }
  function render() {
    clear(head, h("h1", {}, `Application ${app.name}`), app.paused ? h("span", { class: "badge state-paused" }, "Paused") : null);
    clear(use,
      h("div", { class: "count" }, h("div", { class: "count-label" }, "Unfinished tasks"), meter(app.unfinished_tasks, app.max_unfinished_tasks, "unfinished tasks")),
      h("div", { class: "count" }, h("div", { class: "count-label" }, "Permits in use"), meter(app.in_flight, app.max_concurrency, "permits in use")));
    clear(props, dl([
      ["Paused", app.paused ? "yes" : "no"], ["Max concurrency", num(app.max_concurrency)],
      ["Rate per second", num(app.rate_per_second)], ["Max unfinished tasks", num(app.max_unfinished_tasks)],
      ["Revision", app.revision], ["Updated", timeEl(app.updated_at)], ["Id", h("code", {}, app.id)],
    ]));
  }
  await ctx.every(async () => {
    app = await get(path, null, signal);
    render();
    if (formRevision === null) renderForm();
  }, 2000);
}
