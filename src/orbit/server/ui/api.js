// The public HTTP API, called with the signed-in token. Nothing here knows more than the token allows.

const TOKEN = "orbit.token";

export class ApiError extends Error {
  constructor(status, code, message, details, requestId) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
    this.requestId = requestId;
  }
}

export const session = {
  get token() { return sessionStorage.getItem(TOKEN); },
  set token(v) { if (v) sessionStorage.setItem(TOKEN, v); else sessionStorage.removeItem(TOKEN); },
  credential: null,
  can(permission) { return !!this.credential && this.credential.permissions.includes(permission); },
  get allQueues() { return !!this.credential && this.credential.queue_scope === "*"; },
};

export function idempotencyKey() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return "ui-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export async function call(method, path, { query, body, key, signal, token } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v === null || v === undefined || v === "") continue;
    for (const one of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(one));
  }
  const headers = { Authorization: `Bearer ${token || session.token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method === "POST") headers["Idempotency-Key"] = key || idempotencyKey();
  let resp;
  try {
    resp = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal,
      cache: "no-store", credentials: "omit" });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "UNAVAILABLE", "the server does not answer", null, null);
  }
  let envelope = null;
  try { envelope = await resp.json(); } catch { /* not JSON: described below */ }
  if (!resp.ok || !envelope || envelope.error) {
    const err = (envelope && envelope.error) || { code: "INTERNAL", message: `HTTP ${resp.status}` };
    const e = new ApiError(resp.status, err.code, err.message, err.details, envelope && envelope.request_id);
    if (resp.status === 401 && !token) window.dispatchEvent(new CustomEvent("orbit:signed-out", { detail: e }));
    throw e;
  }
  return envelope.data;
}

export const get = (path, query, signal) => call("GET", path, { query, signal });
export const post = (path, body, key) => call("POST", path, { body, key });
export const seg = (id) => encodeURIComponent(id);

// Every item of a cursor-paged list, up to `most`: for pages that show a whole list at once.
export async function allPages(path, query, signal, most = 5000) {
  const items = [];
  let cursor = null;
  do {
    const page = await get(path, { ...query, limit: 1000, cursor }, signal);
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < most);
  return items;
}

export async function signIn(token) {
  const cred = await call("GET", "/v1/credential", { token });
  session.token = token;
  session.credential = cred;
  return cred;
}

export async function restore() {
  if (!session.token) return null;
  try {
    session.credential = await call("GET", "/v1/credential");
    return session.credential;
  } catch (e) {
    if (e.status === 401) session.token = null;
    throw e;
  }
}

export function signOut() {
  session.token = null;
  session.credential = null;
}
