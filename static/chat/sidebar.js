// The sidebar: the panel itself (collapsible on wide screens, a drawer over the page on
// narrow ones) and the conversation list in it (search, open, rename, delete).
import * as api from "./api.js";
import { el, actionButton, ICONS } from "./dom.js";

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
const plainClick = (event) => !(event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0);

// current() -> the open conversation's JSON or null; onOpen(id); onTitle(id, title) when a
// title changed; onDeleted(id); notice: { show }.
export function createConversationList({ list, empty, search, confirm, confirmText, notice, current, onOpen, onTitle, onDeleted }) {
  let loadToken = 0;
  let refreshTimer = null;

  function item(conversation) {
    const li = el("li", "conv-item");
    li.dataset.id = conversation.id;
    const link = el("a", "conv-link", titleOf(conversation));
    link.href = api.conversationPath(conversation.id);
    link.title = titleOf(conversation);
    const rename = actionButton(`Rename “${titleOf(conversation)}”`, "conv-rename", ICONS.edit);
    const remove = actionButton(`Delete “${titleOf(conversation)}”`, "conv-delete", ICONS.delete);
    li.append(link, rename, remove);
    link.addEventListener("click", (event) => {
      if (!plainClick(event)) return;
      event.preventDefault();
      onOpen(conversation.id);
    });
    rename.addEventListener("click", () => startRename(li, conversation));
    remove.addEventListener("click", () => confirmDelete(conversation));
    return li;
  }

  function markCurrent() {
    const open = current();
    for (const li of list.children) {
      const link = li.querySelector(".conv-link");
      const isCurrent = Boolean(open) && li.dataset.id === open.id;
      li.classList.toggle("current", isCurrent);
      if (isCurrent) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  function upsert(conversation, { top = false } = {}) {
    const existing = list.querySelector(`li[data-id="${conversation.id}"]`);
    const li = item(conversation);
    if (existing) existing.replaceWith(li);
    else if (top) list.prepend(li);
    else list.append(li);
    empty.hidden = true;
    markCurrent();
  }

  async function load() {
    const token = ++loadToken;
    const query = search.value.trim();
    try {
      const data = await api.listConversations(query);
      if (token !== loadToken) return;
      list.replaceChildren(...data.conversations.map(item));
      empty.hidden = data.conversations.length > 0;
      empty.textContent = query ? "No conversations match." : "No conversations yet.";
      markCurrent();
      // The server titles a new conversation from its first message; the list brings the title.
      const open = current();
      const listed = open && data.conversations.find((c) => c.id === open.id);
      if (listed && listed.title && listed.title !== open.title) onTitle(listed.id, listed.title);
    } catch (error) {
      if (token !== loadToken) return;
      empty.hidden = false;
      empty.textContent = `Couldn't load conversations: ${error.message}`;
    }
  }

  function refreshSoon(delay = 300) {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(load, delay);
  }

  function startRename(li, conversation) {
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
    const finish = async (save) => {
      if (finished) return;
      finished = true;
      const title = input.value.trim();
      input.remove();
      link.hidden = false;
      li.classList.remove("renaming");
      if (!save || title === (conversation.title || "")) return link.focus();
      try {
        const updated = await api.updateConversation(conversation.id, { title });
        delete updated.messages;
        upsert(updated);
        onTitle(updated.id, updated.title);
        list.querySelector(`li[data-id="${updated.id}"] .conv-link`)?.focus();
      } catch (error) {
        notice.show(error.message);
      }
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === "Escape") {
        event.preventDefault();
        finish(event.key === "Enter");
      }
    });
    input.addEventListener("blur", () => finish(true));
  }

  function confirmDelete(conversation) {
    confirmText.textContent = `“${titleOf(conversation)}” and all its messages will be deleted.`;
    confirm.returnValue = "";
    confirm.showModal();
    confirm.addEventListener("close", async () => {
      if (confirm.returnValue !== "delete") return;
      try {
        await api.deleteConversation(conversation.id);
        list.querySelector(`li[data-id="${conversation.id}"]`)?.remove();
        empty.hidden = list.children.length > 0;
        empty.textContent = "No conversations yet.";
        onDeleted(conversation.id);
      } catch (error) {
        notice.show(error.message);
      }
    }, { once: true });
  }

  search.addEventListener("input", () => refreshSoon(250));

  return { load, refreshSoon, upsert, markCurrent };
}
