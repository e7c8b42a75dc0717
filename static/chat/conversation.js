// The open conversation: its messages on the page, its event stream, and what the user does
// to it (send, stop, regenerate, edit). app.js connects it to the other parts through hooks.
import * as api from "./api.js";
import { ConversationStream, HeldEvents } from "./stream.js";
import { Reply } from "./reply.js";
import { userView, assistantView, openEditForm, copyCodeOnClick } from "./messages.js";

const UNKNOWN_REPLY_WAIT_MS = 800;
const STREAM_READY_WAIT_MS = 3000;
const STOP_CHECK_MS = 4000;
const SILENCE_CHECK_MS = 2000;

export class Conversation {
  // ui: { messages, title, empty }. notice: { show, hide }. setConnection(status). scroll.
  // hooks: controls({ busy, streaming }), shown(conversation), draft() -> settings for a new
  // conversation, created(conversation), listed(conversation), sent().
  constructor({ ui, notice, setConnection, scroll, hooks }) {
    Object.assign(this, { ui, notice, setConnection, scroll, hooks });
    this.current = null; // the open conversation's JSON, without messages
    this.order = []; // message ids in display order
    this.views = new Map(); // message id -> view
    this.stream = null;
    this.busy = false; // a send, edit or regenerate request in flight
    this.loadToken = 0; // the newest navigation wins over slower earlier ones
    this.held = new HeldEvents();
    this.pendingCount = 0;
    copyCodeOnClick(ui.messages);
    setInterval(() => this.eachReply((reply) => reply.checkSilence()), SILENCE_CHECK_MS);
  }

  isOpen(id) {
    return Boolean(this.current) && this.current.id === id;
  }

  eachReply(fn) {
    for (const view of this.views.values()) if (view.kind === "assistant") fn(view.reply);
  }

  // ---- message views

  addMessage(message, { before = null, reply = null } = {}) {
    const view = message.role === "user"
      ? userView(message, { onEdit: (v) => this.startEdit(v) })
      : this.replyView(reply || new Reply(message));
    this.views.set(view.id, view);
    if (before) {
      this.ui.messages.insertBefore(view.root, before.root);
      this.order.splice(this.order.indexOf(before.id), 0, view.id);
    } else {
      this.ui.messages.append(view.root);
      this.order.push(view.id);
    }
    if (view.kind === "assistant") view.paint();
    return view;
  }

  replyView(reply) {
    const view = assistantView(reply, {
      onRegenerate: (v) => this.regenerate(v),
      onRender: () => this.scroll.follow(),
    });
    reply.bind({
      fetchMessage: (id) => (this.views.get(id) === view ? api.getMessage(id) : null),
      onChange: () => {
        view.paint();
        if (!reply.streaming) this.updateControls();
      },
    });
    return view;
  }

  // A reply the server just created, unless its events already made the page show it.
  addReply(message) {
    if (!this.views.has(message.id)) this.addMessage(message);
    this.replayHeld(message.id);
  }

  removeMessage(id) {
    const view = this.views.get(id);
    if (!view) return;
    view.dispose?.();
    view.root.remove();
    this.views.delete(id);
    this.order = this.order.filter((x) => x !== id);
  }

  confirmMessage(tempId, saved) {
    const view = this.views.get(tempId);
    this.views.delete(tempId);
    this.views.set(saved.id, view);
    this.order = this.order.map((x) => (x === tempId ? saved.id : x));
    view.confirm(saved);
  }

  clearMessages() {
    for (const view of this.views.values()) view.dispose?.();
    this.views.clear();
    this.order = [];
    this.ui.messages.replaceChildren();
  }

  streamingView() {
    for (const id of this.order) {
      const view = this.views.get(id);
      if (view.kind === "assistant" && view.reply.streaming) return view;
    }
    return null;
  }

  updateControls() {
    const streaming = Boolean(this.streamingView());
    const busy = this.busy || streaming;
    const last = (kind) => [...this.order].reverse().find((id) => this.views.get(id).kind === kind);
    const lastUser = last("user");
    const lastReply = last("assistant");
    for (const [id, view] of this.views) {
      const isLast = view.kind === "user" ? id === lastUser && !view.pending : id === lastReply;
      view.setState({ isLast, busy });
    }
    this.ui.empty.hidden = this.order.length > 0;
    this.hooks.controls({ busy, streaming });
  }

  setTitle(title) {
    if (this.current) this.current.title = title;
    this.ui.title.textContent = title || "New chat";
    document.title = `${title || "Chat"} · tokenstream`;
  }

  retitle(id, title) {
    if (this.isOpen(id)) this.setTitle(title);
  }

  // Settings saved: the conversation JSON the API answered with.
  update(conversation) {
    if (!this.isOpen(conversation.id)) return;
    Object.assign(this.current, conversation);
    delete this.current.messages;
  }

  // ---- showing and loading

  // Show a conversation (JSON with messages), keeping live replies where we have them: they
  // may be ahead of the saved text.
  show(conversation) {
    const keep = new Map();
    if (this.isOpen(conversation.id)) this.eachReply((reply) => keep.set(reply.id, reply));
    this.current = { ...conversation };
    delete this.current.messages;
    this.setTitle(conversation.title);
    const pending = [...this.views.values()].filter((view) => view.kind === "user" && view.pending);
    const wasStuck = this.scroll.stuck;
    this.eachReply((reply) => keep.has(reply.id) || reply.dispose());
    this.views.clear();
    this.order = [];
    this.ui.messages.replaceChildren();
    for (const message of conversation.messages || []) {
      const reply = keep.get(message.id);
      keep.delete(message.id);
      this.addMessage(message, { reply });
      reply?.snapshot(message);
    }
    for (const reply of keep.values()) reply.dispose();
    for (const view of pending) {
      this.views.set(view.id, view);
      this.order.push(view.id);
      this.ui.messages.append(view.root);
    }
    this.hooks.shown(conversation);
    for (const message of conversation.messages || []) {
      if (message.role === "assistant") this.replayHeld(message.id);
    }
    this.updateControls();
    if (wasStuck) this.scroll.toEnd();
  }

  // Replace whatever is shown by this conversation and follow its events.
  display(conversation) {
    this.closeStream();
    this.clearMessages();
    this.current = null;
    this.scroll.reset();
    this.show(conversation);
    this.openStream(conversation);
  }

  // Resolves to true once the conversation is shown; false if it failed or another
  // navigation came first.
  async open(id) {
    const token = ++this.loadToken;
    try {
      const conversation = await api.getConversation(id);
      if (token !== this.loadToken) return false;
      this.display(conversation);
      return true;
    } catch (error) {
      if (token === this.loadToken) this.notice.show(error.message);
      return false;
    }
  }

  // An empty new chat.
  reset() {
    this.loadToken++;
    this.closeStream();
    this.clearMessages();
    this.current = null;
    this.ui.title.textContent = "New chat";
    document.title = "tokenstream";
    this.updateControls();
  }

  async reload() {
    if (!this.current) return;
    const id = this.current.id;
    try {
      const conversation = await api.getConversation(id);
      if (this.isOpen(id)) this.show(conversation);
    } catch (error) {
      if (error.status === 404) {
        this.notice.show("This conversation no longer exists.");
      } else {
        setTimeout(() => this.isOpen(id) && this.reload(), 2000);
      }
    }
  }

  // ---- the event stream

  openStream(conversation) {
    this.closeStream();
    const stream = new ConversationStream(conversation.events_url, {
      onEvent: (type, data) => stream === this.stream && this.onStreamEvent(type, data),
      onReset: () => stream === this.stream && this.reload(),
      onStatus: (status) => stream === this.stream && this.setConnection(status),
      canReconnect: () => this.canReconnect(conversation.id),
    });
    this.stream = stream;
    // Events sent between the page's snapshot and the stream's opening are not replayed to
    // a fresh connection: catch up from the API once the stream is open.
    stream.ready.then(() => {
      if (stream === this.stream) this.eachReply((reply) => reply.streaming && reply.sync());
    });
    return stream;
  }

  // Reconnecting is pointless when the session ended or the conversation is gone.
  async canReconnect(id) {
    try {
      await api.getConversation(id);
      return true;
    } catch (error) {
      if (error.status === 401 || error.status === 404) {
        this.notice.show(error.message);
        return false;
      }
      return true;
    }
  }

  closeStream() {
    if (this.stream) this.stream.close();
    this.stream = null;
    this.setConnection("live");
  }

  // Back online: the old connection may have died silently. A fresh one resumes from the
  // last event seen (and the page reloads from the API if the server no longer has it).
  reconnect() {
    if (this.stream) this.stream.restart();
    else this.setConnection("live");
  }

  onStreamEvent(type, data) {
    const view = this.views.get(data.message_id);
    if (view && view.kind === "assistant") {
      view.reply.event(type, data);
      return;
    }
    // A reply we do not show yet: our own POST may still be on its way, or another tab
    // sent it. Give the POST a moment, then load the conversation from the API.
    clearTimeout(this.unknownTimer);
    this.unknownTimer = setTimeout(() => {
      if (!this.views.has(data.message_id) && !this.busy) this.reload();
    }, UNKNOWN_REPLY_WAIT_MS);
    this.held.hold(type, data);
  }

  replayHeld(messageId) {
    for (const [type, data] of this.held.take(messageId)) this.onStreamEvent(type, data);
  }

  // ---- what the user does

  canSend() {
    return !this.busy && !this.streamingView();
  }

  // Resolves to false when the message was not sent (the composer then gives the text back).
  async send(text) {
    this.busy = true;
    this.notice.hide();
    const tempId = `pending-${++this.pendingCount}`;
    const temp = this.addMessage({ id: tempId, role: "user", content: text, pending: true });
    this.scroll.toEnd();
    this.updateControls();
    try {
      if (!this.current) await this.create();
      const conversationId = this.current.id;
      const result = await api.sendMessage(conversationId, text);
      if (!this.isOpen(conversationId)) return true;
      if (this.views.get(tempId) === temp) this.confirmMessage(tempId, result.user_message);
      this.addReply(result.assistant_message);
      this.hooks.sent();
      return true;
    } catch (error) {
      if (this.views.get(tempId) === temp) this.removeMessage(tempId);
      this.notice.show(error.message);
      return false;
    } finally {
      this.busy = false;
      this.updateControls();
    }
  }

  async create() {
    const conversation = await api.createConversation({ ...this.hooks.draft() });
    this.current = conversation;
    this.hooks.created(conversation);
    const stream = this.openStream(conversation);
    // The first reply's events go only to streams open when they are sent.
    await Promise.race([stream.ready, new Promise((r) => setTimeout(r, STREAM_READY_WAIT_MS))]);
    this.hooks.listed(conversation);
  }

  // null when nothing is streaming; otherwise a promise that settles once the stop is asked.
  stop() {
    const view = this.streamingView();
    if (!view) return null;
    return api.stopReply(view.id).then(
      // The end event normally follows at once; if it does not, ask the API.
      () => setTimeout(() => view.reply.streaming && view.reply.sync(), STOP_CHECK_MS),
      (error) => this.notice.show(error.message),
    );
  }

  async regenerate(view) {
    if (!this.canSend()) return;
    this.busy = true;
    this.notice.hide();
    this.updateControls();
    try {
      const next = (await api.regenerateReply(view.id)).assistant_message;
      if (!this.views.has(next.id)) this.addMessage(next, { before: this.views.get(view.id) });
      this.removeMessage(view.id);
      this.replayHeld(next.id);
      this.scroll.toEnd();
    } catch (error) {
      this.notice.show(error.message);
    } finally {
      this.busy = false;
      this.updateControls();
    }
  }

  startEdit(view) {
    if (!this.canSend()) return;
    openEditForm(view, (text) => this.edit(view, text));
  }

  // Resolves to true once the edit is sent: the edited message and everything after it are
  // replaced by the server's answer.
  async edit(view, text) {
    if (this.busy) return false;
    this.busy = true;
    this.notice.hide();
    try {
      const result = await api.editMessage(view.id, text);
      const index = this.order.indexOf(view.id);
      for (const old of this.order.slice(index)) this.removeMessage(old);
      this.addMessage(result.user_message);
      this.addReply(result.assistant_message);
      this.scroll.toEnd();
      return true;
    } catch (error) {
      this.notice.show(error.message);
      return false;
    } finally {
      this.busy = false;
      this.updateControls();
    }
  }
}
