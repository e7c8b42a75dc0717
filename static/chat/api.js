// The site's JSON API: session cookie + CSRF header, JSON in and out, readable errors.
// Every address the page uses is written here and nowhere else; the event stream's address
// comes from the server, in each conversation's `events_url`.

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
  405: "The server does not accept that request.",
  409: "A reply is still being written. Wait for it to finish or stop it first.",
  413: "That is too large to send.",
  429: "Too many requests. Wait a moment and try again.",
  502: "The model server did not answer. Try again shortly.",
  503: "The model server is busy or unavailable. Try again shortly.",
  504: "The model server took too long to answer. Try again shortly.",
};

async function request(method, path, body) {
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

// ---- conversations

export const listConversations = (query = "") =>
  request("GET", `/api/conversations/${query ? `?q=${encodeURIComponent(query)}` : ""}`);

export const createConversation = (settings = {}) => request("POST", "/api/conversations/", settings);

// before: a message id (the page's `earlier_cursor`) for the part of a long path above it.
export const getConversation = (id, { before } = {}) =>
  request("GET", `/api/conversations/${id}/${before ? `?before=${encodeURIComponent(before)}` : ""}`);

export const updateConversation = (id, fields) => request("PATCH", `/api/conversations/${id}/`, fields);

export const deleteConversation = (id) => request("DELETE", `/api/conversations/${id}/`);

// ---- messages

export const sendMessage = (conversationId, content) =>
  request("POST", `/api/conversations/${conversationId}/messages/`, { content });

export const getMessage = (id) => request("GET", `/api/messages/${id}/`);

export const stopReply = (messageId) => request("POST", `/api/messages/${messageId}/stop/`, {});

export const regenerateReply = (messageId) => request("POST", `/api/messages/${messageId}/regenerate/`, {});

export const editMessage = (messageId, content) =>
  request("POST", `/api/messages/${messageId}/edit/`, { content });

// The conversation, its active path now running through that message.
export const switchBranch = (conversationId, messageId) =>
  request("POST", `/api/conversations/${conversationId}/switch/`, { message_id: messageId });

// rating: "up", "down" or null; the answer is the message with its `feedback`.
export const setFeedback = (messageId, rating, comment = "") =>
  request("PUT", `/api/messages/${messageId}/feedback/`, { rating, comment });

// ---- presets and sharing

export const listPresets = () => request("GET", "/api/presets/");

export const shareConversation = (conversationId, showOwner) =>
  request("POST", `/api/conversations/${conversationId}/share/`, { show_owner: showOwner });

export const stopSharing = (conversationId) => request("DELETE", `/api/conversations/${conversationId}/share/`);

// ---- models

export const listModels = () => request("GET", "/api/models/");

// ---- usage and API keys

export const getUsage = () => request("GET", "/api/usage/");

export const listKeys = () => request("GET", "/api/keys/");

export const createKey = (name) => request("POST", "/api/keys/", { name });

export const revokeKey = (id) => request("DELETE", `/api/keys/${id}/`);

// ---- page addresses (the browser's location bar, not the API)

export const HOME_PATH = "/";

export const conversationPath = (id) => `/c/${id}/`;

export function conversationIdFromPath(pathname) {
  const match = pathname.match(/^\/c\/([0-9a-f-]{36})\/?$/i);
  return match ? match[1] : null;
}
