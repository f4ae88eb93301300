// The dashboard: sign-in, layout and a hash router. Each page lives in views/ and renders into <main>.
import { ApiError, restore, session, signIn, signOut } from "./api.js";
import { clear, field, h } from "./dom.js";
import { queuesPage, queuePage } from "./views/queues.js";
import { taskPage } from "./views/task.js";
import { schedulesPage, schedulePage } from "./views/schedules.js";
import { keysPage } from "./views/keys.js";
import { applicationPage } from "./views/application.js";
import { eventsPage } from "./views/events.js";
import { auditPage } from "./views/audit.js";
import { errorText } from "./views/common.js";

const ROUTES = [
  [/^\/?$/, queuesPage, "queues"],
  [/^\/queues$/, queuesPage, "queues"],
  [/^\/queues\/([^/]+)$/, queuePage, "queues"],
  [/^\/tasks\/([^/]+)$/, taskPage, "queues"],
  [/^\/schedules$/, schedulesPage, "schedules"],
  [/^\/schedules\/([^/]+)$/, schedulePage, "schedules"],
  [/^\/resource-keys$/, keysPage, "resource-keys"],
  [/^\/application$/, applicationPage, "application"],
  [/^\/events$/, eventsPage, "events"],
  [/^\/audit$/, auditPage, "audit"],
];

const NAV = [
  ["queues", "#/queues", "Queues"],
  ["schedules", "#/schedules", "Schedules"],
  ["resource-keys", "#/resource-keys", "Resource keys"],
  ["application", "#/application", "Application"],
  ["events", "#/events", "Events"],
  ["audit", "#/audit", "Audit log"],
];

const app = document.getElementById("app");
let current = null; // the running page: its timers and its abort signal

function stopPage() {
  if (!current) return;
  current.abort.abort();
  for (const t of current.timers) clearTimeout(t);
  current = null;
}

function layout(active) {
  const cred = session.credential;
  const main = h("main", { id: "main", tabindex: "-1" });
  const status = h("span", { class: "live", id: "live", role: "status", "aria-live": "polite" });
  const header = h("header", { class: "top" },
    h("a", { class: "skip", href: "#main", onclick: (ev) => { ev.preventDefault(); main.focus(); } }, "Skip to content"),
    h("div", { class: "brand" }, h("a", { href: "#/queues" }, "Orbit")),
    h("nav", { "aria-label": "Sections" }, h("ul", {}, NAV.map(([key, href, label]) =>
      h("li", {}, h("a", { href, "aria-current": key === active ? "page" : null }, label))))),
    h("div", { class: "who" },
      status,
      h("span", { class: "cred", title: `credential ${cred.id}, namespace ${cred.namespace_id}` },
        cred.queue_scope === "*" ? "all queues" : `${cred.queue_scope.length} queue(s)`),
      h("button", { type: "button", class: "secondary", id: "sign-out", onclick: () => { signOut(); route(); } }, "Sign out")));
  clear(app, header, main);
  return { main, status };
}

function signInPage(message) {
  stopPage();
  const input = h("textarea", { id: "token", name: "token", rows: 3, autocomplete: "off", spellcheck: "false",
    required: true, "aria-describedby": "token-hint" });
  const error = h("p", { class: "error", role: "alert", id: "signin-error" }, message || "");
  const form = h("form", { class: "signin card", onsubmit: async (ev) => {
    ev.preventDefault();
    const token = tokenFrom(input.value);
    if (!token) { error.textContent = "Paste a token first."; return; }
    error.textContent = "";
    try {
      await signIn(token);
      input.value = "";
      if (!location.hash || location.hash === "#/signin") location.hash = "#/queues";
      route();
    } catch (e) {
      error.textContent = e instanceof ApiError && e.status === 401 ? "This token is not valid (unknown, malformed or revoked)." : errorText(e);
    }
  } },
  h("h1", {}, "Sign in to Orbit"),
  field("API token", input),
  h("p", { class: "hint", id: "token-hint" },
    "Paste the token of a credential: the \"token\" field of the credentials file that ",
    h("code", {}, "orbit dev"), " printed (or the whole file). The page shows only what that token may see, keeps it ",
    "for this browser tab only and sends it nowhere but this server."),
  h("button", { type: "submit" }, "Sign in"), error);
  clear(app, h("main", { id: "main", class: "center" }, form));
  input.focus();
}

// A pasted credentials file works too: take its "token".
function tokenFrom(text) {
  const t = text.trim();
  if (t.startsWith("{")) {
    try { return String(JSON.parse(t).token || "").trim(); } catch { return t; }
  }
  return t;
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, qs] = raw.split("?");
  return { path, query: new URLSearchParams(qs || "") };
}

export function setQuery(params) {
  const { path } = parseHash();
  const qs = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== ""));
  const next = `#${path}${qs.toString() ? `?${qs}` : ""}`;
  if (location.hash !== next) location.hash = next;
}

async function route() {
  stopPage();
  if (!session.token) return signInPage();
  if (!session.credential) {
    try { await restore(); } catch (e) { return signInPage(e.status === 401 ? "Your token is no longer valid; sign in again." : errorText(e)); }
    if (!session.credential) return signInPage();
  }
  const { path, query } = parseHash();
  const found = ROUTES.map(([re, page, nav]) => [path.match(re), page, nav]).find(([m]) => m);
  const { main, status } = layout(found ? found[2] : null);
  const page = { abort: new AbortController(), timers: [] };
  current = page;
  const ctx = {
    main, query, signal: page.abort.signal,
    // Run `fn` now and then every `ms` while this page is shown; a failure shows in the status line.
    every(fn, ms) {
      const tick = async () => {
        if (current !== page) return;
        try {
          await fn();
          if (current === page) status.textContent = `Live · ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
          status.classList.remove("stale");
        } catch (e) {
          if (e.name === "AbortError" || current !== page) return;
          status.textContent = `Not refreshed: ${errorText(e)}`;
          status.classList.add("stale");
        }
        if (current === page) page.timers.push(setTimeout(tick, ms));
      };
      return tick();
    },
  };
  if (!found) {
    clear(main, h("h1", {}, "Not found"), h("p", {}, "No page at this address. ", h("a", { href: "#/queues" }, "Go to the queues.")));
    return;
  }
  try {
    await found[1](ctx, ...found[0].slice(1).map(decodeURIComponent));
  } catch (e) {
    if (e.name === "AbortError" || current !== page) return;
    clear(main, h("h1", {}, "Could not load this page"), h("p", { class: "error", role: "alert" }, errorText(e)));
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("orbit:signed-out", () => { signOut(); signInPage("Your token is no longer valid; sign in again."); });
route();
