// The messages of the shown path, as views on the page in order, and the replies streaming
// on a branch the user switched away from (offPath): those go on receiving their events
// unseen, and are shown, complete, when their branch is shown again.
import * as api from "./api.js";
import { el } from "./dom.js";

export class Thread {
  // container: the element holding the views. makeView(message, reply) -> a view of
  // messages.js (a reply is passed to take over a live Reply).
  constructor(container, makeView) {
    this.container = container;
    this.makeView = makeView;
    this.order = []; // message ids in display order
    this.views = new Map(); // message id -> view
    this.offPath = new Map(); // message id -> Reply streaming on a branch not shown
  }

  get size() {
    return this.order.length;
  }

  has(id) {
    return this.views.has(id);
  }

  get(id) {
    return this.views.get(id);
  }

  // The live Reply of a message, shown or off the path.
  reply(id) {
    const view = this.views.get(id);
    return view?.kind === "assistant" ? view.reply : this.offPath.get(id);
  }

  eachReply(fn) {
    for (const view of this.views.values()) if (view.kind === "assistant") fn(view.reply);
    for (const reply of this.offPath.values()) fn(reply);
  }

  // The reply being written, shown or not (a conversation has at most one).
  streamingReply() {
    for (const view of this.views.values()) if (view.kind === "assistant" && view.reply.streaming) return view.reply;
    for (const reply of this.offPath.values()) if (reply.streaming) return reply;
    return null;
  }

  add(message, reply = null) {
    const view = this.makeView(message, reply);
    this.views.set(view.id, view);
    this.container.append(view.root);
    this.order.push(view.id);
    if (view.kind === "assistant") view.paint();
    return view;
  }

  // A view kept across a re-render (a message being sent): appended as it is.
  append(view) {
    this.views.set(view.id, view);
    this.order.push(view.id);
    this.container.append(view.root);
  }

  remove(id) {
    const view = this.views.get(id);
    if (!view) return;
    view.dispose?.();
    view.root.remove();
    this.views.delete(id);
    this.order = this.order.filter((x) => x !== id);
  }

  // The messages from this one to the end of the path leave the page (an edit or a
  // regenerate puts a new branch in their place).
  removeFrom(id) {
    const index = this.order.indexOf(id);
    if (index >= 0) for (const old of this.order.slice(index)) this.remove(old);
  }

  confirm(tempId, saved) {
    const view = this.views.get(tempId);
    this.views.delete(tempId);
    this.views.set(saved.id, view);
    this.order = this.order.map((x) => (x === tempId ? saved.id : x));
    view.confirm(saved);
  }

  // A long path comes a page at a time: a button above the first message loads the part
  // before it (load(cursor)), by click or once it scrolls into view.
  showEarlier(cursor, load) {
    this.earlierObserver?.disconnect();
    this.earlier?.remove();
    this.earlier = null;
    if (!cursor) return;
    const button = el("button", "button subtle load-earlier", "Load earlier messages");
    button.type = "button";
    let loading = false;
    const go = () => {
      if (loading) return;
      loading = true;
      button.textContent = "Loading…";
      load(cursor).finally(() => { loading = false; button.textContent = "Load earlier messages"; });
    };
    button.addEventListener("click", go);
    this.container.prepend(button);
    this.earlier = button;
    if (typeof IntersectionObserver === "function") {
      this.earlierObserver = new IntersectionObserver((entries) => entries.some((e) => e.isIntersecting) && go());
      this.earlierObserver.observe(button);
    }
  }

  // Messages older than every shown one (a page of the path), above them in order.
  prepend(messages) {
    const before = this.earlier ? this.earlier.nextSibling : this.container.firstChild;
    for (const message of messages) {
      if (this.views.has(message.id)) continue;
      const view = this.makeView(message, null);
      this.views.set(view.id, view);
      this.container.insertBefore(view.root, before);
      if (view.kind === "assistant") view.paint();
    }
    const added = messages.map((m) => m.id).filter((id) => !this.order.includes(id));
    this.order = [...added, ...this.order];
  }

  // Empties the page. keepReplies: leave the Replies alive (a re-render takes them over).
  clear({ keepReplies = false } = {}) {
    this.earlierObserver?.disconnect();
    this.earlier = null;
    if (!keepReplies) this.eachReply((reply) => reply.dispose());
    this.views.clear();
    this.offPath.clear();
    this.order = [];
    this.container.replaceChildren();
  }

  // A streaming reply whose branch is not shown. onSettled() once it ends.
  keepOffPath(reply, onSettled) {
    reply.bind({
      fetchMessage: (id) => (this.offPath.get(id) === reply ? api.getMessage(id) : null),
      onChange: () => reply.streaming || onSettled(),
    });
    this.offPath.set(reply.id, reply);
  }

  // The views with other versions, in order (for the keyboard).
  withVersions() {
    return this.order.map((id) => this.views.get(id)).filter((view) => view.nav?.hasVersions);
  }

  pendingViews() {
    return [...this.views.values()].filter((view) => view.kind === "user" && view.pending);
  }
}
