// Pieces shared by the pages: notices, reason-bearing action forms, cursor paging.
import { ApiError } from "../api.js";
import { clear, field, h } from "../dom.js";

export function errorText(e) {
  if (e instanceof ApiError) {
    const hint = e.code === "PERMISSION_DENIED" ? " (this token does not allow it)" : "";
    return `${e.code}: ${e.message}${hint}`;
  }
  return String(e && e.message ? e.message : e);
}

export function notice(el, kind, text) {
  el.className = `notice ${kind}`;
  el.setAttribute("role", kind === "error" ? "alert" : "status");
  el.textContent = text;
}

// A form whose action needs a reason (written to the audit record). `extra` are more fields.
export function reasonForm({ id, title, button, extra = [], danger = false, onSubmit, describe }) {
  const reason = h("input", { type: "text", name: "reason", id: `${id}-reason`, required: true, maxlength: 1024,
    autocomplete: "off", placeholder: "Why (kept in the audit log)" });
  const out = h("p", { class: "notice", id: `${id}-result`, "aria-live": "polite" });
  const submit = h("button", { type: "submit", class: danger ? "danger" : null, id: `${id}-submit` }, button);
  const form = h("form", { class: "action", id, "aria-label": title, onsubmit: async (ev) => {
    ev.preventDefault();
    if (!reason.value.trim()) { notice(out, "error", "A reason is required."); reason.focus(); return; }
    submit.disabled = true;
    try {
      const message = await onSubmit(reason.value.trim());
      notice(out, "ok", message || "Done.");
      reason.value = "";
    } catch (e) {
      notice(out, "error", conflictText(e));
    } finally {
      submit.disabled = false;
    }
  } }, title ? h("h3", {}, title) : null, describe ? h("p", { class: "hint" }, describe) : null,
  extra, field("Reason", reason), submit, out);
  return form;
}

export function conflictText(e) {
  if (e instanceof ApiError && e.code === "STATE_CONFLICT") {
    return `Not applied (${e.code}): ${e.message}. Someone else changed it since this page read it; ` +
      "the values shown are refreshed, check them and try again.";
  }
  return errorText(e);
}

// Forward-only cursors with a stack for "Previous".
export class Pager {
  constructor(onChange) {
    this.stack = [null];
    this.next = null;
    this.onChange = onChange;
    this.el = h("nav", { class: "pager", "aria-label": "Pages" });
  }
  get cursor() { return this.stack[this.stack.length - 1]; }
  reset() { this.stack = [null]; this.next = null; }
  render(nextCursor) {
    this.next = nextCursor;
    const prev = h("button", { type: "button", class: "secondary", disabled: this.stack.length <= 1,
      onclick: () => { this.stack.pop(); this.onChange(); } }, "← Previous");
    const next = h("button", { type: "button", class: "secondary", disabled: !nextCursor,
      onclick: () => { this.stack.push(this.next); this.onChange(); } }, "Next →");
    clear(this.el, prev, h("span", { class: "page-no" }, `Page ${this.stack.length}`), next);
    return this.el;
  }
}

export function section(title, ...children) {
  return h("section", { class: "card", "aria-label": title }, h("h2", {}, title), children);
}
