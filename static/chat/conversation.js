// The open conversation: its active path on the page (thread.js), its event stream, and
// what the user does to it (send, stop, regenerate, edit, switch branch, rate). app.js
// connects it to the other parts through hooks.
import * as api from "./api.js";
import { ConversationStream, HeldEvents } from "./stream.js";
import { Reply } from "./reply.js";
import { Thread } from "./thread.js";
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
    this.thread = new Thread(ui.messages, (message, reply) => this.makeView(message, reply));
    this.stream = null;
    this.busy = false; // a send, edit, regenerate or switch request in flight
    this.loadToken = 0; // the newest navigation wins over slower earlier ones
    this.held = new HeldEvents();
    this.pendingCount = 0;
    copyCodeOnClick(ui.messages);
    setInterval(() => this.thread.eachReply((reply) => reply.checkSilence()), SILENCE_CHECK_MS);
  }

  isOpen(id) {
    return Boolean(this.current) && this.current.id === id;
  }

  // ---- message views

  makeView(message, reply) {
    const onSwitch = (id) => this.switchTo(id);
    if (message.role === "user") return userView(message, { onEdit: (v) => this.startEdit(v), onSwitch });
    reply ??= new Reply(message);
    const view = assistantView(reply, {
      onRegenerate: (v) => this.regenerate(v),
      onRender: () => this.scroll.follow(),
      onSwitch,
      onRate: (v, rating, comment) => this.rate(v, rating, comment),
    });
    reply.bind({
      fetchMessage: (id) => (this.thread.get(id) === view ? api.getMessage(id) : null),
      onChange: () => {
        view.paint();
        if (!reply.streaming) this.updateControls();
      },
    });
    return view;
  }

  // A reply the server just created, unless its events already made the page show it.
  addReply(message) {
    if (!this.thread.has(message.id)) this.thread.add(message);
    this.replayHeld(message.id);
  }

  updateControls() {
    const streaming = Boolean(this.thread.streamingReply());
    const busy = this.busy || streaming;
    for (const view of this.thread.views.values()) view.setState({ busy, locked: this.busy });
    this.ui.empty.hidden = this.thread.size > 0;
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

  // Show a conversation (JSON with its active path), keeping live replies where we have
  // them: they may be ahead of the saved text. One streaming on another branch stays alive
  // off the page.
  show(conversation) {
    const keep = new Map();
    if (this.isOpen(conversation.id)) this.thread.eachReply((reply) => keep.set(reply.id, reply));
    else this.thread.eachReply((reply) => reply.dispose());
    this.current = { ...conversation };
    delete this.current.messages;
    this.setTitle(conversation.title);
    const pending = this.thread.pendingViews();
    const wasStuck = this.scroll.stuck;
    this.thread.clear({ keepReplies: true });
    for (const message of conversation.messages || []) {
      const reply = keep.get(message.id);
      keep.delete(message.id);
      this.thread.add(message, reply);
      reply?.snapshot(message);
    }
    const stale = this.keepStreaming(keep, conversation.streaming_reply);
    for (const view of pending) this.thread.append(view);
    this.thread.showEarlier(conversation.earlier_cursor, (cursor) => this.loadEarlier(conversation.id, cursor));
    this.hooks.shown(conversation);
    for (const message of conversation.messages || []) {
      if (message.role === "assistant") this.replayHeld(message.id);
    }
    for (const id of this.thread.offPath.keys()) this.replayHeld(id);
    this.updateControls();
    if (wasStuck) this.scroll.toEnd();
    // A snapshot older than what the page saw (a slow GET overtaken by a send): ask again.
    if (stale) setTimeout(() => this.isOpen(conversation.id) && this.reload(), UNKNOWN_REPLY_WAIT_MS);
  }

  // The page of the path above the first shown message; the reader's view stays put.
  async loadEarlier(id, cursor) {
    try {
      const page = await api.getConversation(id, { before: cursor });
      if (!this.isOpen(id)) return;
      const anchor = this.thread.get(this.thread.order[0])?.root;
      const top = anchor?.getBoundingClientRect().top;
      this.thread.prepend(page.messages || []);
      this.thread.showEarlier(page.earlier_cursor, (next) => this.loadEarlier(id, next));
      const scroller = anchor?.closest("#messages-scroll");
      if (scroller) scroller.scrollTop += anchor.getBoundingClientRect().top - top;
    } catch (error) {
      this.notice.show(`Couldn't load earlier messages: ${error.message}`);
    }
  }

  // Live replies not on the shown path: one still streaming stays (off the page), the rest
  // go. streaming: the API's streaming_reply, which the page may not know yet (after a
  // reload on another branch). True when the snapshot did not know a reply the page streams.
  keepStreaming(kept, streaming) {
    const settled = () => this.updateControls();
    let stale = false;
    for (const reply of kept.values()) {
      if (!reply.streaming) {
        reply.dispose();
        continue;
      }
      this.thread.keepOffPath(reply, settled);
      stale ||= streaming?.id !== reply.id;
    }
    if (streaming && !this.thread.has(streaming.id)) {
      const known = this.thread.offPath.get(streaming.id);
      if (known) known.snapshot(streaming);
      else this.thread.keepOffPath(new Reply(streaming), settled);
    }
    return stale;
  }

  // Replace whatever is shown by this conversation and follow its events.
  display(conversation) {
    this.closeStream();
    this.thread.clear();
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
    this.thread.clear();
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
      if (stream === this.stream) this.thread.eachReply((reply) => reply.streaming && reply.sync());
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
    const reply = this.thread.reply(data.message_id);
    if (reply) {
      reply.event(type, data);
      return;
    }
    // A reply we do not show yet: our own POST may still be on its way, or another tab
    // sent it. Give the POST a moment, then load the conversation from the API.
    clearTimeout(this.unknownTimer);
    this.unknownTimer = setTimeout(() => {
      if (!this.thread.reply(data.message_id) && !this.busy) this.reload();
    }, UNKNOWN_REPLY_WAIT_MS);
    this.held.hold(type, data);
  }

  replayHeld(messageId) {
    for (const [type, data] of this.held.take(messageId)) this.onStreamEvent(type, data);
  }

  // ---- what the user does

  canSend() {
    return !this.busy && !this.thread.streamingReply();
  }

  // Resolves to false when the message was not sent (the composer then gives the text back).
  async send(text) {
    this.busy = true;
    this.notice.hide();
    const tempId = `pending-${++this.pendingCount}`;
    const temp = this.thread.add({ id: tempId, role: "user", content: text, pending: true });
    this.scroll.toEnd();
    this.updateControls();
    try {
      if (!this.current) await this.create();
      const conversationId = this.current.id;
      const result = await api.sendMessage(conversationId, text);
      if (!this.isOpen(conversationId)) return true;
      if (this.thread.get(tempId) === temp) this.thread.confirm(tempId, result.user_message);
      this.addReply(result.assistant_message);
      this.hooks.sent();
      return true;
    } catch (error) {
      if (this.thread.get(tempId) === temp) this.thread.remove(tempId);
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
    const reply = this.thread.streamingReply();
    if (!reply) return null;
    return api.stopReply(reply.id).then(
      // The end event normally follows at once; if it does not, ask the API.
      () => setTimeout(() => reply.streaming && reply.sync(), STOP_CHECK_MS),
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
      // The new reply ends the path: what followed the old one stays on its branch.
      this.thread.removeFrom(view.id);
      this.addReply(next);
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

  // Resolves to true once the edit is sent: the edited message and everything after it make
  // way for the new branch (still one sibling away).
  async edit(view, text) {
    if (this.busy) return false;
    this.busy = true;
    this.notice.hide();
    this.updateControls();
    try {
      const result = await api.editMessage(view.id, text);
      this.thread.removeFrom(view.id);
      this.thread.add(result.user_message);
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

  // Show another version of a message: the server moves the active path, and the page shows
  // it, keeping live replies (a streaming one may leave the page and come back).
  async switchTo(messageId) {
    if (!this.current || this.busy) return;
    const id = this.current.id;
    const token = ++this.loadToken;
    this.notice.hide();
    try {
      const conversation = await api.switchBranch(id, messageId);
      if (token !== this.loadToken || !this.isOpen(id)) return;
      this.show(conversation);
      this.thread.get(messageId)?.nav.root.querySelector("button:not(:disabled)")?.focus({ preventScroll: true });
    } catch (error) {
      if (token === this.loadToken) this.notice.show(error.message);
    }
  }

  // The keyboard's previous/next version: the message holding the focus, else the last one
  // with versions.
  stepVersion(delta) {
    const focused = document.activeElement?.closest?.(".msg");
    const views = this.thread.withVersions();
    const view = views.find((v) => v.root === focused) || views[views.length - 1];
    return view ? view.nav.step(delta) : false;
  }

  async rate(view, rating, comment) {
    const message = await api.setFeedback(view.id, rating, comment);
    view.showFeedback(message.feedback);
    return message.feedback;
  }
}
