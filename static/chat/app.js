// The chat page: finds its elements, builds the parts and connects them. Each part is in its
// own module; navigation (which conversation is open, the address bar) is here because it
// touches them all.
import * as api from "./api.js";
import { createNotice, createConnectionStatus } from "./notice.js";
import { createScroll } from "./scroll.js";
import { Conversation } from "./conversation.js";
import { createComposer } from "./composer.js";
import { createSidebarPanel, ConversationList } from "./sidebar.js";
import { Settings } from "./settings.js";
import { PresetPicker } from "./presets.js";
import { ShareDialog } from "./sharing.js";
import { installShortcuts } from "./shortcuts.js";
import { Account } from "./account.js";
import { isPlainClick } from "./dom.js";

const $ = (selector) => document.querySelector(selector);

const notice = createNotice({ box: $("#notice"), text: $("#notice-text"), close: $("#notice-close") });
const setConnection = createConnectionStatus($("#conn-status"));
const prompt = $("#prompt");
const scroll = createScroll({
  scroller: $("#messages-scroll"), content: $("#messages"), jump: $("#jump-latest"),
  onJump: () => prompt.focus(),
});
const panel = createSidebarPanel({
  app: $("#app"), toggle: $("#sidebar-toggle"), close: $("#sidebar-close"), scrim: $("#scrim"), search: $("#search"),
});

// The parts below need each other. Their hooks run only once all are built, so a hook may
// name a part built after it.
const conversation = new Conversation({
  ui: { messages: $("#messages"), title: $("#chat-title"), empty: $("#empty-state") },
  notice, setConnection, scroll,
  hooks: {
    controls: (state) => composer.setControls(state),
    shown: (shown) => {
      settings.fill(shown);
      list.markCurrent();
      $("#share-toggle").hidden = false;
    },
    draft: () => settings.draft,
    created: (created) => {
      settings.clearDraft();
      settings.fill(created);
      $("#share-toggle").hidden = false;
      history.pushState({ id: created.id }, "", api.conversationPath(created.id));
    },
    listed: (created) => list.upsert(created, { top: true }),
    sent: () => list.refreshSoon(),
  },
});

const composer = createComposer({
  form: $("#composer"), prompt, sendButton: $("#send"), stopButton: $("#stop"),
  canSend: () => conversation.canSend(),
  send: (text) => conversation.send(text),
  stop: () => conversation.stop(),
});

const list = new ConversationList({
  list: $("#conv-list"), empty: $("#conv-empty"), search: $("#search"),
  confirm: $("#confirm-delete"), confirmText: $("#confirm-text"), notice,
  current: () => conversation.current,
  onOpen: (id) => openConversation(id),
  onTitle: (id, title) => conversation.retitle(id, title),
  onDeleted: (id) => conversation.isOpen(id) && newChat(),
});

const presets = new PresetPicker({
  container: $("#preset-picker"),
  onChoose: (id) => {
    settings.choosePreset(id);
    composer.focus();
  },
});

const settings = new Settings({
  panel: $("#settings"), form: $("#settings-form"), status: $("#settings-status"),
  toggle: $("#settings-toggle"), cancel: $("#settings-cancel"),
  fields: {
    preset: $("#set-preset"), system: $("#set-system"), model: $("#set-model"),
    temperature: $("#set-temperature"), maxTokens: $("#set-max-tokens"),
    knobs: [...document.querySelectorAll("[data-knob]")],
  },
  hint: $("#set-system-hint"), badge: $("#preset-badge"), presets,
  current: () => conversation.current,
  onSaved: (updated) => conversation.update(updated),
});

const sharing = new ShareDialog({
  ui: {
    dialog: $("#share-dialog"), showOwner: $("#share-show-owner"), link: $("#share-link"),
    url: $("#share-url"), copy: $("#share-copy"), create: $("#share-create"),
    revoke: $("#share-revoke"), status: $("#share-status"),
  },
  current: () => conversation.current,
  onChanged: (id, share) => conversation.isOpen(id) && (conversation.current.share = share),
});
$("#share-toggle").addEventListener("click", () => sharing.open());
const account = new Account({
  usage: $("#usage"), keyList: $("#key-list"), keyForm: $("#key-form"), keyName: $("#key-name"),
  secretBox: $("#key-secret"), secretValue: $("#key-secret-value"), copy: $("#key-copy"),
  status: $("#account-status"), apiBase: $("#api-base"),
});
// Settings' own listener has toggled the panel by now: refresh the figures when it opened.
$("#settings-toggle").addEventListener("click", () => {
  if (!$("#settings").hidden) account.load();
  else account.forgetSecret();
});
$("#settings-cancel").addEventListener("click", () => account.forgetSecret());

async function openConversation(id, { push = true } = {}) {
  if (conversation.isOpen(id)) return panel.closeIfNarrow();
  notice.hide();
  settings.close();
  if (!(await conversation.open(id))) return;
  if (push) history.pushState({ id }, "", api.conversationPath(id));
  panel.closeIfNarrow();
  composer.focus({ preventScroll: true });
}

function newChat({ push = true } = {}) {
  conversation.reset();
  settings.clearDraft();
  notice.hide();
  settings.close();
  if (push && location.pathname !== api.HOME_PATH) history.pushState({}, "", api.HOME_PATH);
  settings.fill({});
  $("#share-toggle").hidden = true;
  list.markCurrent();
  panel.closeIfNarrow();
  composer.focus();
}

function routeFromLocation() {
  const id = api.conversationIdFromPath(location.pathname);
  if (id) openConversation(id, { push: false });
  else newChat({ push: false });
}

window.addEventListener("popstate", routeFromLocation);
window.addEventListener("offline", () => setConnection("offline"));
window.addEventListener("online", () => conversation.reconnect());
for (const link of [$("#new-chat"), $("#brand")]) {
  link.addEventListener("click", (event) => {
    if (!isPlainClick(event)) return;
    event.preventDefault();
    newChat();
  });
}

installShortcuts({
  dialog: $("#shortcuts-dialog"),
  toggle: $("#shortcuts-toggle"),
  actions: {
    "new-chat": () => newChat(),
    "focus-composer": () => composer.focus(),
    stop: () => Boolean(conversation.stop()),
    "previous-version": () => conversation.stepVersion(-1),
    "next-version": () => conversation.stepVersion(1),
  },
});

const initial = JSON.parse($("#initial-conversation").textContent);
if (initial && initial.id) {
  history.replaceState({ id: initial.id }, "", location.href);
  // Replies still streaming pick up from their next_seq; a gap fetches the saved text.
  conversation.display(initial);
} else {
  newChat({ push: false });
}
list.load();
presets.load().then(() => settings.fillPresets());
composer.autosize();
scroll.toEnd();
composer.focus({ preventScroll: true });
document.documentElement.dataset.ready = "1";
