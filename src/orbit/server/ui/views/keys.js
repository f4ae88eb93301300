// Resource keys: permit pools shared by queues, with their permits in use.
import { allPages } from "../api.js";
import { badge, clear, fmtTime, h, meter, table, timeEl } from "../dom.js";
import { section } from "./common.js";

export async function keysPage(ctx) {
  const { main, signal } = ctx;
  const list = h("div", { id: "key-list" });
  clear(main, h("div", { class: "page-head" }, h("h1", {}, "Resource keys"),
    h("p", { class: "hint" }, "A task naming a key holds one of its permits from claim to release; live.")), section("Resource keys", list));
  await ctx.every(async () => {
    const items = await allPages("/v1/resource-keys", { include_retired: true }, signal);
    clear(list, table(["Key", "State", "Permits in use", "Revision", "Updated"], items.map((k) => [
      h("strong", { dataset: { key: k.name } }, k.name),
      k.retired_at ? badge("RETIRED") : badge("ACTIVE"),
      meter(k.in_use, k.max_concurrency, `permits of ${k.name}`),
      k.revision,
      h("span", { title: fmtTime(k.updated_at) }, timeEl(k.updated_at)),
    ]), { empty: "No resource keys." }));
  }, 2000);
}
