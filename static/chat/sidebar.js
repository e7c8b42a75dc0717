// The sidebar: the panel itself (collapsible on wide screens, a drawer over the page on
// narrow ones) and the conversation list in it (search, open, rename, delete).
import * as api from "./api.js";
import { el, actionButton, ICONS, isPlainClick } from "./dom.js";

const NARROW = "(max-width: 800px)";
const narrow = () => window.matchMedia(NARROW).matches;

export function createSidebarPanel({ app, toggle, close, scrim, search }) {
  const isOpen = () =>
    narrow() ? app.classList.contains("sidebar-open") : !app.classList.contains("sidebar-collapsed");

  function setOpen(open) {
    if (narrow()) {
      app.classList.toggle("sidebar-open", open);
      scrim.hidden = !open;
      if (open) search.focus({ preventScroll: true });
    } else {
      app.classList.toggle("sidebar-collapsed", !open);
    }
    toggle.setAttribute("aria-expanded", String(open));
  }

  const closeAndReturn = () => {
    setOpen(false);
    toggle.focus();
  };
  toggle.addEventListener("click", () => setOpen(!isOpen()));
  close.addEventListener("click", closeAndReturn);
  scrim.addEventListener("click", () => setOpen(false));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && narrow() && isOpen()) closeAndReturn();
  });
  // The drawer state means nothing on a wide screen and vice versa.
  window.matchMedia(NARROW).addEventListener("change", () => {
    app.classList.remove("sidebar-open");
    scrim.hidden = true;
    toggle.setAttribute("aria-expanded", String(isOpen()));
  });
  toggle.setAttribute("aria-expanded", String(isOpen()));

  return {
    // After choosing a conversation on a phone the drawer gets out of the way.
    closeIfNarrow() {
      if (narrow() && isOpen()) setOpen(false);
    },
  };
}

const titleOf = (conversation) => conversation.title || "New chat";

// The conversation list. current() -> the open conversation's JSON or null; onOpen(id);
// onTitle(id, title) when a title changed; onDeleted(id); notice: { show }.
export class ConversationList {
  constructor({ list, empty, search, confirm, confirmText, notice, current, onOpen, onTitle, onDeleted }) {
    Object.assign(this, { list, empty, search, confirm, confirmText, notice, current, onOpen, onTitle, onDeleted });
    this.loadToken = 0;
    this.refreshTimer = null;
    search.addEventListener("input", () => this.refreshSoon(250));
  }

  item(conversation) {
    const li = el("li", "conv-item");
    li.dataset.id = conversation.id;
    const link = el("a", "conv-link", titleOf(conversation));
    link.href = api.conversationPath(conversation.id);
    link.title = titleOf(conversation);
    if (conversation.source === "api") {
      // Made by a program with an API key, not typed here.
      link.prepend(el("span", "conv-badge", "API"), " ");
      link.title = `${titleOf(conversation)} (through the API)`;
    }
    const rename = actionButton(`Rename “${titleOf(conversation)}”`, "conv-rename", ICONS.edit);
    const remove = actionButton(`Delete “${titleOf(conversation)}”`, "conv-delete", ICONS.delete);
    li.append(link, rename, remove);
    link.addEventListener("click", (event) => {
      if (!isPlainClick(event)) return;
      event.preventDefault();
      this.onOpen(conversation.id);
    });
    rename.addEventListener("click", () => this.startRename(li, conversation));
    remove.addEventListener("click", () => this.confirmDelete(conversation));
    return li;
  }

  markCurrent() {
    const open = this.current();
    for (const li of this.list.children) {
      const link = li.querySelector(".conv-link");
      const isCurrent = Boolean(open) && li.dataset.id === open.id;
      li.classList.toggle("current", isCurrent);
      if (isCurrent) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  upsert(conversation, { top = false } = {}) {
    const existing = this.list.querySelector(`li[data-id="${conversation.id}"]`);
    const li = this.item(conversation);
    if (existing) existing.replaceWith(li);
    else if (top) this.list.prepend(li);
    else this.list.append(li);
    this.empty.hidden = true;
    this.markCurrent();
  }

  async load() {
    const token = ++this.loadToken;
    const query = this.search.value.trim();
    try {
      const data = await api.listConversations(query);
      if (token !== this.loadToken) return;
      this.list.replaceChildren(...data.conversations.map((c) => this.item(c)));
      this.empty.hidden = data.conversations.length > 0;
      this.empty.textContent = query ? "No conversations match." : "No conversations yet.";
      this.markCurrent();
      // The server titles a new conversation from its first message; the list brings the title.
      const open = this.current();
      const listed = open && data.conversations.find((c) => c.id === open.id);
      if (listed && listed.title && listed.title !== open.title) this.onTitle(listed.id, listed.title);
    } catch (error) {
      if (token !== this.loadToken) return;
      this.empty.hidden = false;
      this.empty.textContent = `Couldn't load conversations: ${error.message}`;
    }
  }

  refreshSoon(delay = 300) {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => this.load(), delay);
  }

  startRename(li, conversation) {
    const link = li.querySelector(".conv-link");
    const input = el("input", "conv-rename-input");
    input.type = "text";
    input.value = conversation.title || "";
    input.maxLength = 200;
    input.setAttribute("aria-label", "New title");
    link.hidden = true;
    li.classList.add("renaming");
    li.prepend(input);
    input.focus();
    input.select();
    let finished = false;
    const finish = (save) => {
      if (finished) return;
      finished = true;
      input.remove();
      link.hidden = false;
      li.classList.remove("renaming");
      const title = input.value.trim();
      if (!save || title === (conversation.title || "")) link.focus();
      else this.rename(conversation.id, title);
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === "Escape") {
        event.preventDefault();
        finish(event.key === "Enter");
      }
    });
    input.addEventListener("blur", () => finish(true));
  }

  async rename(id, title) {
    try {
      const updated = await api.updateConversation(id, { title });
      delete updated.messages;
      this.upsert(updated);
      this.onTitle(updated.id, updated.title);
      this.list.querySelector(`li[data-id="${updated.id}"] .conv-link`)?.focus();
    } catch (error) {
      this.notice.show(error.message);
    }
  }

  confirmDelete(conversation) {
    const { confirm } = this;
    this.confirmText.textContent = `“${titleOf(conversation)}” and all its messages will be deleted.`;
    confirm.returnValue = "";
    confirm.showModal();
    confirm.addEventListener("close", () => {
      if (confirm.returnValue === "delete") this.delete(conversation.id);
    }, { once: true });
  }

  async delete(id) {
    try {
      await api.deleteConversation(id);
      this.list.querySelector(`li[data-id="${id}"]`)?.remove();
      this.empty.hidden = this.list.children.length > 0;
      this.empty.textContent = "No conversations yet.";
      this.onDeleted(id);
    } catch (error) {
      this.notice.show(error.message);
    }
  }
}
