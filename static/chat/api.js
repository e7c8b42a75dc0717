// The site's JSON API: session cookie + CSRF header, JSON in and out, readable errors.

export class ApiError extends Error {
  constructor(message, status, data = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.data = data;
  }
}

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [key, ...rest] = part.trim().split("=");
    if (key === name) return decodeURIComponent(rest.join("="));
  }
  return "";
}

const FALLBACK_MESSAGES = {
  400: "The request was not accepted.",
  401: "Your session has ended. Reload the page and sign in again.",
  403: "You are not allowed to do that. Reload the page and sign in again.",
  404: "That conversation or message no longer exists.",
  409: "A reply is still being written. Wait for it to finish or stop it first.",
  413: "That is too large to send.",
  429: "Too many requests. Wait a moment and try again.",
  502: "The model server did not answer. Try again shortly.",
  503: "The model server is busy or unavailable. Try again shortly.",
  504: "The model server took too long to answer. Try again shortly.",
};

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const init = { method, headers, credentials: "same-origin" };
  if (method !== "GET") headers["X-CSRFToken"] = cookie("csrftoken");
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError("Can't reach the server. Check your connection and try again.", 0);
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message =
      (data && data.error && data.error.message) ||
      FALLBACK_MESSAGES[response.status] ||
      `The server answered with an error (${response.status}).`;
    throw new ApiError(message, response.status, data);
  }
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body = {}) => api("POST", path, body);
export const patch = (path, body) => api("PATCH", path, body);
export const del = (path) => api("DELETE", path);
