// The chat page: conversation list, the open conversation, streaming replies.
import * as api from "./api.js";
import { ConversationStream, ReplyText } from "./stream.js";
import { StreamingMarkdown, renderMarkdown, copyText } from "./render.js";

const $ = (selector) => document.querySelector(selector);
const el = (tag, className, text) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
};
const reducedMotion = () => window.matchMedia("(prefers-reduced-motion: reduce)").matches;
const narrow = () => window.matchMedia("(max-width: 800px)").matches;

const ui = {
  app: $("#app"),
  sidebar: $("#sidebar"),
  sidebarToggle: $("#sidebar-toggle"),
  sidebarClose: $("#sidebar-close"),
  scrim: $("#scrim"),
  newChat: $("#new-chat"),
  brand: $("#brand"),
  search: $("#search"),
  list: $("#conv-list"),
  listEmpty: $("#conv-empty"),
  title: $("#chat-title"),
  conn: $("#conn-status"),
  settingsToggle: $("#settings-toggle"),
  settings: $("#settings"),
  settingsForm: $("#settings-form"),
  settingsStatus: $("#settings-status"),
  settingsCancel: $("#settings-cancel"),
  system: $("#set-system"),
  model: $("#set-model"),
  temperature: $("#set-temperature"),
  maxTokens: $("#set-max-tokens"),
  scroller: $("#messages-scroll"),
  messages: $("#messages"),
  empty: $("#empty-state"),
  jump: $("#jump-latest"),
  notice: $("#notice"),
  noticeText: $("#notice-text"),
  noticeClose: $("#notice-close"),
  composer: $("#composer"),
  prompt: $("#prompt"),
  send: $("#send"),
  stop: $("#stop"),
  confirm: $("#confirm-delete"),
  confirmText: $("#confirm-text"),
};

const state = {
  conv: null, // the open conversation (JSON without messages)
  order: [], // message ids in display order
  views: new Map(), // id -> message view
  stream: null,
  loadToken: 0,
  busy: false, // a send/edit/regenerate request in flight
  draft: {}, // settings chosen before the first message of a new chat
  conversations: [],
};

// ---------------------------------------------------------------- notices & status

function showNotice(message) {
  ui.noticeText.textContent = message;
  ui.notice.hidden = false;
}
function hideNotice() {
  ui.notice.hidden = true;
  ui.noticeText.textContent = "";
}
ui.noticeClose.addEventListener("click", hideNotice);

function setConnStatus(status) {
  const text = { live: "", reconnecting: "Reconnecting…", offline: "Offline", closed: "Disconnected" }[status] ?? "";
  ui.conn.textContent = text;
  ui.conn.dataset.state = status;
}
window.addEventListener("offline", () => setConnStatus("offline"));
window.addEventListener("online", () => {
  // The old connection may have died silently: open a fresh one that resumes from the
  // last event seen (and reload from the API if the server no longer has it).
  if (state.stream) state.stream.restart();
  else setConnStatus("live");
});

// ---------------------------------------------------------------- scrolling

let stick = true;
let lastTop = 0;
function distanceFromBottom() {
  const s = ui.scroller;
  return s.scrollHeight - s.scrollTop - s.clientHeight;
}
ui.scroller.addEventListener("scroll", () => {
  const top = ui.scroller.scrollTop;
  const distance = distanceFromBottom();
  if (distance <= 24) stick = true;
  else if (top < lastTop) stick = false;
  lastTop = top;
  ui.jump.hidden = stick || distance <= 24;
}, { passive: true });

function follow() {
  if (stick) {
    ui.scroller.scrollTop = ui.scroller.scrollHeight;
    lastTop = ui.scroller.scrollTop;
  } else {
    ui.jump.hidden = distanceFromBottom() <= 24;
  }
}
function scrollToEnd(smooth = false) {
  stick = true;
  ui.scroller.scrollTo({ top: ui.scroller.scrollHeight, behavior: smooth && !reducedMotion() ? "smooth" : "auto" });
  lastTop = ui.scroller.scrollTop;
  ui.jump.hidden = true;
}
ui.jump.addEventListener("click", () => {
  scrollToEnd(true);
  ui.prompt.focus();
});
new ResizeObserver(() => follow()).observe(ui.messages);

// ---------------------------------------------------------------- formatting

function formatMeta(m) {
  const parts = [];
  if (m.model) parts.push(m.model);
  if (m.ttft_ms != null) parts.push(`first token ${m.ttft_ms < 1000 ? Math.round(m.ttft_ms) + " ms" : (m.ttft_ms / 1000).toFixed(1) + " s"}`);
  if (m.tokens_per_second != null) parts.push(`${Number(m.tokens_per_second).toFixed(1)} tok/s`);
  if (m.completion_tokens != null) parts.push(`${m.completion_tokens} tokens`);
  if (m.finish_reason === "length") parts.push("stopped at the token limit");
  if (m.status === "cancelled" || m.finish_reason === "cancelled") parts.push("stopped");
  return parts.join(" · ");
}

const STATUS_ERRORS = {
  failed: "The reply failed.",
  interrupted: "The reply was interrupted before it finished.",
};

// ---------------------------------------------------------------- message views

function actionButton(label, className, icon) {
  const button = el("button", `action ${className}`);
  button.type = "button";
  button.setAttribute("aria-label", label);
  button.title = label;
  button.innerHTML = icon; // static markup from this file, never model text
  return button;
}
const ICONS = {
  copy: '<svg aria-hidden="true" viewBox="0 0 24 24" width="16" height="16"><rect x="9" y="9" width="11" height="11" rx="2"/><path d="M5 15V5a2 2 0 0 1 2-2h8"/></svg>',
  regen: '<svg aria-hidden="true" viewBox="0 0 24 24" width="16" height="16"><path d="M20 11a8 8 0 1 0-2.3 5.7M20 4v7h-7"/></svg>',
  edit: '<svg aria-hidden="true" viewBox="0 0 24 24" width="16" height="16"><path d="M4 20h4L19 9l-4-4L4 16v4zM14 6l4 4"/></svg>',
};

function userView(message) {
  const root = el("article", "msg msg-user");
  root.dataset.role = "user";
  const bubble = el("div", "bubble", message.content);
  const actions = el("div", "msg-actions");
  const edit = actionButton("Edit and resend", "edit", ICONS.edit);
  const copy = actionButton("Copy message", "copy", ICONS.copy);
  actions.append(edit, copy);
  root.append(bubble, actions);
  const view = {
    kind: "user",
    id: message.id,
    root,
    message,
    setId(id) {
      view.id = id;
      root.dataset.messageId = id;
    },
    setLast(isLast) {
      edit.hidden = !isLast;
    },
    setBusy(busy) {
      edit.disabled = busy;
    },
  };
  view.setId(message.id);
  if (message.pending) root.classList.add("pending");
  edit.addEventListener("click", () => startEdit(view));
  copy.addEventListener("click", () => flashCopied(copy, copyText(view.message.content)));
  return view;
}

function assistantView(message) {
  const root = el("article", "msg msg-assistant");
  root.dataset.role = "assistant";
  root.dataset.messageId = message.id;
  const body = el("div", "msg-body md");
  const typing = el("div", "typing");
  typing.setAttribute("aria-label", "The model is writing");
  typing.append(el("span"), el("span"), el("span"));
  const error = el("div", "msg-error");
  error.setAttribute("role", "alert");
  const errorText = el("p", "msg-error-text");
  const retry = el("button", "button small", "Retry");
  retry.type = "button";
  error.append(errorText, retry);
  error.hidden = true;
  const foot = el("div", "msg-foot");
  const meta = el("span", "msg-meta");
  const actions = el("div", "msg-actions");
  const copy = actionButton("Copy reply", "copy", ICONS.copy);
  const regen = actionButton("Regenerate reply", "regenerate", ICONS.regen);
  actions.append(copy, regen);
  foot.append(actions, meta);
  root.append(body, typing, error, foot);

  const md = new StreamingMarkdown(body, { onRender: follow });
  const view = {
    kind: "assistant",
    id: message.id,
    root,
    message: { ...message },
    reply: null,
    isLast: false,
    busy: false,
    // Paint the current state: text (streamed or final), error, meta, buttons.
    paint() {
      const m = view.message;
      const text = view.reply ? view.reply.content : m.content || "";
      const streaming = view.reply ? view.reply.streaming : m.status === "streaming";
      root.dataset.status = streaming ? "streaming" : m.status;
      if (streaming) {
        md.set(text);
        body.setAttribute("aria-busy", "true");
      } else {
        if (!md.finished || md.text !== text) md.finish(text);
        body.removeAttribute("aria-busy");
      }
      typing.hidden = !(streaming && !text);
      const problem = !streaming && (m.status === "failed" || m.status === "interrupted");
      error.hidden = !problem;
      if (problem) {
        errorText.textContent = m.error || STATUS_ERRORS[m.status];
        retry.hidden = !view.isLast || m.retryable === false;
        retry.disabled = view.busy;
      }
      foot.hidden = streaming;
      meta.textContent = streaming ? "" : formatMeta(m);
      copy.hidden = !text;
      regen.hidden = !view.isLast || problem;
      regen.disabled = view.busy;
    },
    setLast(isLast) {
      view.isLast = isLast;
      view.paint();
    },
    setBusy(busy) {
      view.busy = busy;
      view.paint();
    },
    dispose() {
      view.reply?.dispose();
    },
  };
  copy.addEventListener("click", () => flashCopied(copy, copyText(view.reply ? view.reply.content : view.message.content || "")));
  regen.addEventListener("click", () => regenerate(view));
  retry.addEventListener("click", () => regenerate(view));
  return view;
}

async function flashCopied(button, promise) {
  const ok = await promise;
  button.classList.add(ok ? "copied" : "copy-failed");
  const label = button.getAttribute("aria-label");
  button.setAttribute("aria-label", ok ? "Copied" : "Copy failed");
  setTimeout(() => {
    button.classList.remove("copied", "copy-failed");
    button.setAttribute("aria-label", label);
  }, 1500);
}

// Code block copy buttons (the Markdown renderer adds them; one listener serves all).
ui.messages.addEventListener("click", (event) => {
  const button = event.target.closest(".copy-code");
  if (!button) return;
  const code = button.closest(".code-block")?.querySelector("code");
  const done = copyText(code ? code.textContent.replace(/\n$/, "") : "");
  done.then((ok) => {
    button.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => (button.textContent = "Copy"), 1500);
  });
});

// ---------------------------------------------------------------- the open conversation

function makeReply(view, message) {
  const reply = new ReplyText(message, {
    fetchMessage: (id) => (state.views.get(id) === view ? api.get(`/api/messages/${id}/`) : null),
    onChange: (fresh) => {
      if (fresh) Object.assign(view.message, fresh);
      view.paint();
      if (!reply.streaming) updateControls();
    },
  });
  view.reply = reply;
  return reply;
}

function addMessage(message, { before = null } = {}) {
  const view = message.role === "user" ? userView(message) : assistantView(message);
  if (view.kind === "assistant") makeReply(view, message);
  state.views.set(message.id, view);
  if (before) {
    ui.messages.insertBefore(view.root, before.root);
    state.order.splice(state.order.indexOf(before.id), 0, message.id);
  } else {
    ui.messages.append(view.root);
    state.order.push(message.id);
  }
  if (view.kind === "assistant") view.paint();
  return view;
}

function removeMessage(id) {
  const view = state.views.get(id);
  if (!view) return;
  view.dispose?.();
  view.root.remove();
  state.views.delete(id);
  state.order = state.order.filter((x) => x !== id);
}

function renameMessage(oldId, message) {
  const view = state.views.get(oldId);
  state.views.delete(oldId);
  state.views.set(message.id, view);
  state.order = state.order.map((x) => (x === oldId ? message.id : x));
  view.message = message;
  view.setId(message.id);
  view.root.classList.remove("pending");
}

function clearMessages() {
  for (const view of state.views.values()) view.dispose?.();
  state.views.clear();
  state.order = [];
  ui.messages.replaceChildren();
}

function streamingView() {
  for (const id of state.order) {
    const view = state.views.get(id);
    if (view.kind === "assistant" && view.reply.streaming) return view;
  }
  return null;
}

function updateControls() {
  const streaming = streamingView();
  const busy = state.busy || Boolean(streaming);
  const lastUser = [...state.order].reverse().find((id) => state.views.get(id).kind === "user");
  const lastReply = [...state.order].reverse().find((id) => state.views.get(id).kind === "assistant");
  for (const [id, view] of state.views) {
    view.busy = busy;
    if (view.kind === "user") {
      view.setLast(id === lastUser && !view.root.classList.contains("pending"));
      view.setBusy(busy);
    } else {
      view.isLast = id === lastReply;
      view.paint();
    }
  }
  ui.stop.hidden = !streaming;
  ui.send.hidden = Boolean(streaming);
  ui.send.disabled = busy || !ui.prompt.value.trim();
  ui.empty.hidden = state.order.length > 0;
}

// Show a conversation (JSON with messages), keeping live reply state where we have it.
function showConversation(conversation) {
  const keep = new Map();
  if (state.conv && state.conv.id === conversation.id) {
    for (const [id, view] of state.views) if (view.kind === "assistant") keep.set(id, view.reply);
  }
  state.conv = { ...conversation };
  delete state.conv.messages;
  ui.title.textContent = conversation.title || "New chat";
  document.title = `${conversation.title || "Chat"} · tokenstream`;
  const pending = [...state.views.values()].filter((v) => v.root.classList.contains("pending"));
  const wasStuck = stick;
  // Keep the live trackers: they may be ahead of the saved text.
  for (const reply of keep.values()) reply.onChange = () => {};
  for (const view of state.views.values()) if (view.kind === "assistant" && !keep.has(view.id)) view.dispose();
  state.views.clear();
  state.order = [];
  ui.messages.replaceChildren();
  for (const message of conversation.messages || []) {
    const view = addMessage(message);
    const old = keep.get(message.id);
    if (view.kind === "assistant" && old) {
      view.reply.dispose();
      view.reply = old;
      old.fetchMessage = (id) => (state.views.get(id) === view ? api.get(`/api/messages/${id}/`) : null);
      old.onChange = (fresh) => {
        if (fresh) Object.assign(view.message, fresh);
        view.paint();
        if (!old.streaming) updateControls();
      };
      old.snapshot(message);
    }
  }
  for (const view of pending) {
    state.views.set(view.id, view);
    state.order.push(view.id);
    ui.messages.append(view.root);
  }
  fillSettings(conversation);
  for (const message of conversation.messages || []) if (message.role === "assistant") replayEarly(message.id);
  updateControls();
  if (wasStuck) scrollToEnd();
  markCurrentInList();
}

async function reloadConversation() {
  if (!state.conv) return;
  const id = state.conv.id;
  try {
    const conversation = await api.get(`/api/conversations/${id}/`);
    if (state.conv && state.conv.id === id) showConversation(conversation);
  } catch (error) {
    if (error.status === 404) {
      showNotice("This conversation no longer exists.");
    } else {
      setTimeout(() => state.conv && state.conv.id === id && reloadConversation(), 2000);
    }
  }
}

function openStream(conversation) {
  closeStream();
  const stream = new ConversationStream(conversation.events_url, {
    onEvent: (type, data) => stream === state.stream && onStreamEvent(type, data),
    onReset: () => stream === state.stream && reloadConversation(),
    onStatus: (status) => stream === state.stream && setConnStatus(status),
    canReconnect: async () => {
      try {
        await api.get(`/api/conversations/${conversation.id}/`);
        return true;
      } catch (error) {
        if (error.status === 401 || error.status === 404) {
          showNotice(error.message);
          return false;
        }
        return true;
      }
    },
  });
  state.stream = stream;
  // Events sent between the page's snapshot and the stream's opening are not replayed to
  // a fresh connection: catch up from the API once the stream is open.
  stream.ready.then(() => {
    if (stream !== state.stream) return;
    for (const view of state.views.values()) if (view.kind === "assistant" && view.reply.streaming) view.reply.sync();
  });
  return stream;
}

// A streaming reply that has been silent for a while is checked against the API, so a
// lost end event can never leave it spinning.
setInterval(() => {
  const now = performance.now();
  for (const view of state.views.values()) {
    if (view.kind === "assistant" && view.reply.streaming && now - view.reply.lastActivity > 8000) {
      view.reply.lastActivity = now;
      view.reply.sync();
    }
  }
}, 2000);

function closeStream() {
  if (state.stream) state.stream.close();
  state.stream = null;
  setConnStatus("live");
}

let unknownTimer = null;
function onStreamEvent(type, data) {
  const view = state.views.get(data.message_id);
  if (!view || view.kind !== "assistant") {
    // A reply we do not show yet: our own POST may still be on its way, or another tab
    // sent it. Give the POST a moment, then load the conversation from the API.
    clearTimeout(unknownTimer);
    unknownTimer = setTimeout(() => {
      if (!state.views.has(data.message_id) && !state.busy) reloadConversation();
    }, 800);
    earlyEvents.push([type, data]);
    if (earlyEvents.length > 5000) earlyEvents.shift();
    return;
  }
  const reply = view.reply;
  if (type === "token") {
    reply.token(data.seq, data.text);
  } else if (type === "message.start") {
    if (data.model) view.message.model = data.model;
  } else if (type === "message.end") {
    Object.assign(view.message, {
      finish_reason: data.finish_reason,
      ttft_ms: data.ttft_ms ?? view.message.ttft_ms,
      tokens_per_second: data.tokens_per_second ?? view.message.tokens_per_second,
      model: data.model || view.message.model,
      completion_tokens: data.usage?.completion_tokens ?? view.message.completion_tokens,
      status: data.finish_reason === "cancelled" ? "cancelled" : "complete",
    });
    if (reply.hasGap || !reply.streaming) {
      reply.sync();
    } else {
      reply.status = view.message.status;
      view.paint();
      updateControls();
    }
  } else if (type === "message.error") {
    Object.assign(view.message, { status: "failed", error: data.error, retryable: data.retryable });
    reply.status = "failed";
    view.paint();
    updateControls();
    reply.sync(); // the saved partial text and final status
  }
}

// Events that arrived before the POST that created their reply answered.
const earlyEvents = [];
function replayEarly(messageId) {
  const mine = earlyEvents.filter(([, data]) => data.message_id === messageId);
  for (let i = earlyEvents.length - 1; i >= 0; i--) if (earlyEvents[i][1].message_id === messageId) earlyEvents.splice(i, 1);
  for (const [type, data] of mine) onStreamEvent(type, data);
}

// ---------------------------------------------------------------- navigation

async function openConversation(id, { push = true } = {}) {
  if (state.conv && state.conv.id === id) return closeSidebarIfNarrow();
  const token = ++state.loadToken;
  hideNotice();
  closeSettings();
  try {
    const conversation = await api.get(`/api/conversations/${id}/`);
    if (token !== state.loadToken) return;
    closeStream();
    clearMessages();
    state.conv = null;
    stick = true;
    if (push) history.pushState({ id }, "", `/c/${id}/`);
    showConversation(conversation);
    openStream(conversation);
    closeSidebarIfNarrow();
    ui.prompt.focus({ preventScroll: true });
  } catch (error) {
    if (token === state.loadToken) showNotice(error.message);
  }
}

function newChat({ push = true } = {}) {
  state.loadToken++;
  closeStream();
  clearMessages();
  state.conv = null;
  state.draft = {};
  hideNotice();
  closeSettings();
  ui.title.textContent = "New chat";
  document.title = "tokenstream";
  if (push && location.pathname !== "/") history.pushState({}, "", "/");
  fillSettings({});
  updateControls();
  markCurrentInList();
  closeSidebarIfNarrow();
  ui.prompt.focus();
}

function routeFromLocation() {
  const match = location.pathname.match(/^\/c\/([0-9a-f-]{36})\/?$/i);
  if (match) openConversation(match[1], { push: false });
  else newChat({ push: false });
}
window.addEventListener("popstate", routeFromLocation);

for (const link of [ui.newChat, ui.brand]) {
  link.addEventListener("click", (event) => {
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
    event.preventDefault();
    newChat();
  });
}

// ---------------------------------------------------------------- sending

function autosize() {
  const area = ui.prompt;
  area.style.height = "auto";
  area.style.height = `${Math.min(area.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
}
ui.prompt.addEventListener("input", () => {
  autosize();
  updateControls();
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    if (!ui.send.disabled && !ui.send.hidden) ui.composer.requestSubmit();
  }
});
ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = ui.prompt.value;
  if (!text.trim() || state.busy || streamingView()) return;
  send(text);
});

let pendingCount = 0;
async function send(text) {
  state.busy = true;
  hideNotice();
  const tempId = `pending-${++pendingCount}`;
  const temp = addMessage({ id: tempId, role: "user", content: text, pending: true });
  ui.prompt.value = "";
  autosize();
  scrollToEnd();
  updateControls();
  try {
    if (!state.conv) {
      const conversation = await api.post("/api/conversations/", { ...state.draft });
      state.conv = conversation;
      state.draft = {};
      history.pushState({ id: conversation.id }, "", `/c/${conversation.id}/`);
      const stream = openStream(conversation);
      await Promise.race([stream.ready, new Promise((r) => setTimeout(r, 3000))]);
      upsertListItem(conversation, { top: true });
    }
    const conversationId = state.conv.id;
    const result = await api.post(`/api/conversations/${conversationId}/messages/`, { content: text });
    if (!state.conv || state.conv.id !== conversationId) return;
    if (state.views.get(tempId) === temp) renameMessage(tempId, result.user_message);
    if (!state.views.has(result.assistant_message.id)) addMessage(result.assistant_message);
    replayEarly(result.assistant_message.id);
    refreshListSoon();
  } catch (error) {
    if (state.views.get(tempId) === temp) removeMessage(tempId);
    if (!ui.prompt.value) {
      ui.prompt.value = text;
      autosize();
    }
    showNotice(error.message);
  } finally {
    state.busy = false;
    updateControls();
  }
}

ui.stop.addEventListener("click", async () => {
  const view = streamingView();
  if (!view) return;
  ui.stop.disabled = true;
  try {
    await api.post(`/api/messages/${view.id}/stop/`);
    // The end event normally follows at once; if it does not, ask the API.
    setTimeout(() => view.reply.streaming && view.reply.sync(), 4000);
  } catch (error) {
    showNotice(error.message);
  } finally {
    ui.stop.disabled = false;
    ui.prompt.focus();
  }
});

async function regenerate(view) {
  if (state.busy || streamingView()) return;
  state.busy = true;
  hideNotice();
  updateControls();
  try {
    const result = await api.post(`/api/messages/${view.id}/regenerate/`);
    const next = result.assistant_message;
    if (!state.views.has(next.id)) addMessage(next, { before: state.views.get(view.id) });
    removeMessage(view.id);
    replayEarly(next.id);
    scrollToEnd();
  } catch (error) {
    showNotice(error.message);
  } finally {
    state.busy = false;
    updateControls();
  }
}

function startEdit(view) {
  if (state.busy || streamingView()) return;
  const root = view.root;
  root.classList.add("editing");
  const form = el("form", "edit-form");
  const label = el("label", "visually-hidden", "Edit your message");
  const area = el("textarea");
  const id = `edit-${view.id}`;
  area.id = id;
  label.htmlFor = id;
  area.value = view.message.content;
  area.rows = Math.min(12, Math.max(2, area.value.split("\n").length));
  const buttons = el("div", "edit-actions");
  const cancel = el("button", "button subtle", "Cancel");
  cancel.type = "button";
  const save = el("button", "button primary", "Send");
  save.type = "submit";
  buttons.append(cancel, save);
  form.append(label, area, buttons);
  root.append(form);
  area.focus();
  area.setSelectionRange(area.value.length, area.value.length);
  const close = () => {
    form.remove();
    root.classList.remove("editing");
  };
  cancel.addEventListener("click", close);
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") close();
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = area.value;
    if (!text.trim() || state.busy) return;
    state.busy = true;
    save.disabled = true;
    hideNotice();
    try {
      const result = await api.post(`/api/messages/${view.id}/edit/`, { content: text });
      const index = state.order.indexOf(view.id);
      for (const old of state.order.slice(index)) removeMessage(old);
      addMessage(result.user_message);
      if (!state.views.has(result.assistant_message.id)) addMessage(result.assistant_message);
      replayEarly(result.assistant_message.id);
      scrollToEnd();
    } catch (error) {
      save.disabled = false;
      showNotice(error.message);
    } finally {
      state.busy = false;
      updateControls();
    }
  });
}

// ---------------------------------------------------------------- conversation list

function markCurrentInList() {
  for (const item of ui.list.children) {
    const link = item.querySelector(".conv-link");
    const current = Boolean(state.conv) && item.dataset.id === state.conv.id;
    item.classList.toggle("current", current);
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function listItem(conversation) {
  const item = el("li", "conv-item");
  item.dataset.id = conversation.id;
  const link = el("a", "conv-link", conversation.title || "New chat");
  link.href = `/c/${conversation.id}/`;
  link.title = conversation.title || "New chat";
  const rename = actionButton(`Rename “${conversation.title || "New chat"}”`, "conv-rename", ICONS.edit);
  const remove = actionButton(`Delete “${conversation.title || "New chat"}”`, "conv-delete",
    '<svg aria-hidden="true" viewBox="0 0 24 24" width="16" height="16"><path d="M5 7h14M10 11v6M14 11v6M7 7l1 13h8l1-13M9 7V4h6v3"/></svg>');
  item.append(link, rename, remove);
  link.addEventListener("click", (event) => {
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
    event.preventDefault();
    openConversation(conversation.id);
  });
  rename.addEventListener("click", () => startRename(item, conversation));
  remove.addEventListener("click", () => confirmDelete(conversation));
  return item;
}

function upsertListItem(conversation, { top = false } = {}) {
  const existing = ui.list.querySelector(`li[data-id="${conversation.id}"]`);
  const item = listItem(conversation);
  if (existing) existing.replaceWith(item);
  else if (top) ui.list.prepend(item);
  else ui.list.append(item);
  ui.listEmpty.hidden = true;
  markCurrentInList();
}

let listToken = 0;
async function loadList() {
  const token = ++listToken;
  const query = ui.search.value.trim();
  try {
    const data = await api.get(`/api/conversations/${query ? `?q=${encodeURIComponent(query)}` : ""}`);
    if (token !== listToken) return;
    state.conversations = data.conversations;
    ui.list.replaceChildren(...data.conversations.map(listItem));
    ui.listEmpty.hidden = data.conversations.length > 0;
    ui.listEmpty.textContent = query ? "No conversations match." : "No conversations yet.";
    markCurrentInList();
    const current = state.conv && data.conversations.find((c) => c.id === state.conv.id);
    if (current && current.title && current.title !== state.conv.title) {
      state.conv.title = current.title;
      ui.title.textContent = current.title;
      document.title = `${current.title} · tokenstream`;
    }
  } catch (error) {
    if (token !== listToken) return;
    ui.listEmpty.hidden = false;
    ui.listEmpty.textContent = `Couldn't load conversations: ${error.message}`;
  }
}
let listTimer = null;
function refreshListSoon(delay = 300) {
  clearTimeout(listTimer);
  listTimer = setTimeout(loadList, delay);
}
ui.search.addEventListener("input", () => refreshListSoon(250));

function startRename(item, conversation) {
  const link = item.querySelector(".conv-link");
  const input = el("input", "conv-rename-input");
  input.type = "text";
  input.value = conversation.title || "";
  input.maxLength = 200;
  input.setAttribute("aria-label", "New title");
  link.hidden = true;
  item.classList.add("renaming");
  item.prepend(input);
  input.focus();
  input.select();
  let finished = false;
  const finish = async (save) => {
    if (finished) return;
    finished = true;
    const title = input.value.trim();
    input.remove();
    link.hidden = false;
    item.classList.remove("renaming");
    if (!save || title === (conversation.title || "")) return link.focus();
    try {
      const updated = await api.patch(`/api/conversations/${conversation.id}/`, { title });
      delete updated.messages;
      upsertListItem(updated);
      if (state.conv && state.conv.id === updated.id) {
        state.conv.title = updated.title;
        ui.title.textContent = updated.title || "New chat";
        document.title = `${updated.title || "Chat"} · tokenstream`;
      }
      ui.list.querySelector(`li[data-id="${updated.id}"] .conv-link`)?.focus();
    } catch (error) {
      showNotice(error.message);
    }
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      finish(true);
    } else if (event.key === "Escape") {
      event.preventDefault();
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
}

function confirmDelete(conversation) {
  ui.confirmText.textContent = `“${conversation.title || "New chat"}” and all its messages will be deleted.`;
  ui.confirm.returnValue = "";
  ui.confirm.showModal();
  ui.confirm.addEventListener("close", async () => {
    if (ui.confirm.returnValue !== "delete") return;
    try {
      await api.del(`/api/conversations/${conversation.id}/`);
      ui.list.querySelector(`li[data-id="${conversation.id}"]`)?.remove();
      ui.listEmpty.hidden = ui.list.children.length > 0;
      ui.listEmpty.textContent = "No conversations yet.";
      if (state.conv && state.conv.id === conversation.id) newChat();
    } catch (error) {
      showNotice(error.message);
    }
  }, { once: true });
}

// ---------------------------------------------------------------- sidebar

function setSidebar(open) {
  if (narrow()) {
    ui.app.classList.toggle("sidebar-open", open);
    ui.scrim.hidden = !open;
    if (open) ui.search.focus({ preventScroll: true });
  } else {
    ui.app.classList.toggle("sidebar-collapsed", !open);
  }
  ui.sidebarToggle.setAttribute("aria-expanded", String(open));
}
function sidebarOpen() {
  return narrow() ? ui.app.classList.contains("sidebar-open") : !ui.app.classList.contains("sidebar-collapsed");
}
function closeSidebarIfNarrow() {
  if (narrow() && sidebarOpen()) setSidebar(false);
}
ui.sidebarToggle.addEventListener("click", () => setSidebar(!sidebarOpen()));
ui.sidebarClose.addEventListener("click", () => {
  setSidebar(false);
  ui.sidebarToggle.focus();
});
ui.scrim.addEventListener("click", () => setSidebar(false));
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && narrow() && sidebarOpen()) {
    setSidebar(false);
    ui.sidebarToggle.focus();
  }
});
window.matchMedia("(max-width: 800px)").addEventListener("change", () => {
  ui.app.classList.remove("sidebar-open");
  ui.scrim.hidden = true;
  ui.sidebarToggle.setAttribute("aria-expanded", String(sidebarOpen()));
});
ui.sidebarToggle.setAttribute("aria-expanded", String(sidebarOpen()));

// ---------------------------------------------------------------- settings

let modelsLoaded = false;
async function loadModels() {
  if (modelsLoaded) return;
  try {
    const data = await api.get("/api/models/");
    modelsLoaded = true;
    const current = ui.model.value;
    const options = [new Option("Server default", "")];
    for (const model of data.models || []) {
      const label = model.context_length ? `${model.id} (${model.context_length} tokens)` : model.id;
      options.push(new Option(label, model.id));
    }
    ui.model.replaceChildren(...options);
    setModelValue(current);
  } catch (error) {
    ui.settingsStatus.textContent = `Couldn't load the model list: ${error.message}`;
  }
}
function setModelValue(value) {
  if (value && ![...ui.model.options].some((o) => o.value === value)) ui.model.append(new Option(value, value));
  ui.model.value = value || "";
}

function fillSettings(conversation) {
  ui.system.value = conversation.system_prompt || "";
  setModelValue(conversation.model || "");
  ui.temperature.value = conversation.temperature ?? "";
  ui.maxTokens.value = conversation.max_tokens ?? "";
}

function readSettings() {
  const number = (input, integer) => {
    const raw = input.value.trim();
    if (!raw) return null;
    const value = Number(raw);
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
      throw new Error(`${input.labels[0].textContent} must be ${integer ? "a whole number" : "a number"}.`);
    }
    return value;
  };
  return {
    system_prompt: ui.system.value,
    model: ui.model.value,
    temperature: number(ui.temperature, false),
    max_tokens: number(ui.maxTokens, true),
  };
}

function openSettings() {
  ui.settings.hidden = false;
  ui.settingsToggle.setAttribute("aria-expanded", "true");
  ui.settingsStatus.textContent = state.conv ? "" : "These settings apply to the new chat when you send its first message.";
  loadModels();
  ui.system.focus();
}
function closeSettings() {
  ui.settings.hidden = true;
  ui.settingsToggle.setAttribute("aria-expanded", "false");
}
ui.settingsToggle.addEventListener("click", () => (ui.settings.hidden ? openSettings() : closeSettings()));
ui.settingsCancel.addEventListener("click", () => {
  closeSettings();
  ui.settingsToggle.focus();
});
ui.settings.addEventListener("keydown", (event) => {
  if (event.key === "Escape") {
    closeSettings();
    ui.settingsToggle.focus();
  }
});
ui.settingsForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  let fields;
  try {
    fields = readSettings();
  } catch (error) {
    ui.settingsStatus.textContent = error.message;
    return;
  }
  if (!state.conv) {
    state.draft = fields;
    ui.settingsStatus.textContent = "Saved for this new chat.";
    return;
  }
  const id = state.conv.id;
  ui.settingsStatus.textContent = "Saving…";
  try {
    const updated = await api.patch(`/api/conversations/${id}/`, fields);
    if (state.conv && state.conv.id === id) {
      Object.assign(state.conv, { ...updated, messages: undefined });
      fillSettings(updated);
    }
    ui.settingsStatus.textContent = "Saved.";
  } catch (error) {
    ui.settingsStatus.textContent = error.message;
  }
});

// ---------------------------------------------------------------- start

function start() {
  const initial = JSON.parse(document.getElementById("initial-conversation").textContent);
  if (initial && initial.id) {
    history.replaceState({ id: initial.id }, "", location.href);
    showConversation(initial);
    openStream(initial);
    // Replies still streaming: the page was rendered a moment ago; live tokens pick up
    // from next_seq, and a gap triggers a fetch of the saved text.
  } else {
    newChat({ push: false });
  }
  loadList();
  autosize();
  scrollToEnd();
  ui.prompt.focus({ preventScroll: true });
  document.documentElement.dataset.ready = "1";
}

start();
