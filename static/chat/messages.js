// The DOM of one message: the user's bubble (with edit) and the assistant's reply (text,
// typing dots, error with Retry, meta line, copy, regenerate and feedback), each with the
// "‹ 2/3 ›" of its other versions. A view paints state it is given; it changes nothing but
// its own nodes.
import { el, actionButton, ICONS, isPlainEnter } from "./dom.js";
import { StreamingMarkdown, copyText } from "./render.js";
import { branchNav } from "./branches.js";
import { feedbackControls } from "./feedback.js";

const STATUS_ERRORS = {
  failed: "The reply failed.",
  interrupted: "The reply was interrupted before it finished.",
};

export function formatMeta(m) {
  const parts = [];
  if (m.model) parts.push(m.model);
  if (m.ttft_ms != null) parts.push(`first token ${m.ttft_ms < 1000 ? Math.round(m.ttft_ms) + " ms" : (m.ttft_ms / 1000).toFixed(1) + " s"}`);
  if (m.tokens_per_second != null) parts.push(`${Number(m.tokens_per_second).toFixed(1)} tok/s`);
  if (m.completion_tokens != null) parts.push(`${m.completion_tokens} tokens`);
  if (m.finish_reason === "length") parts.push("stopped at the token limit");
  if (m.status === "cancelled" || m.finish_reason === "cancelled") parts.push("stopped");
  if (m.preset_name) parts.push(`preset ${m.preset_name}`);
  return parts.join(" · ");
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

// actions: onEdit(view), onSwitch(messageId).
export function userView(message, { onEdit, onSwitch }) {
  const root = el("article", "msg msg-user");
  root.dataset.role = "user";
  const bubble = el("div", "bubble", message.content);
  const foot = el("div", "msg-foot");
  const actions = el("div", "msg-actions");
  const edit = actionButton("Edit and resend", "edit", ICONS.edit);
  const copy = actionButton("Copy message", "copy", ICONS.copy);
  const nav = branchNav({ onSwitch });
  actions.append(edit, copy);
  foot.append(actions, nav.root);
  root.append(bubble, foot);
  const view = {
    kind: "user",
    id: message.id,
    root,
    message,
    get pending() {
      return root.classList.contains("pending");
    },
    // The pending bubble becomes the saved message once the POST answers.
    confirm(saved) {
      view.message = saved;
      view.setId(saved.id);
      root.classList.remove("pending");
    },
    setId(id) {
      view.id = id;
      root.dataset.messageId = id;
      nav.set(view.message.siblings, id);
    },
    // busy: no new reply may start now; locked: a request of this page is in flight.
    setState({ busy, locked }) {
      edit.hidden = view.pending;
      edit.disabled = busy;
      nav.setLocked(locked);
    },
    nav,
  };
  view.setId(message.id);
  if (message.pending) root.classList.add("pending");
  edit.addEventListener("click", () => onEdit(view));
  copy.addEventListener("click", () => flashCopied(copy, copyText(view.message.content)));
  return view;
}

// percent: how much of a long prompt the server has read (Reply.readPercent), null: none.
function paintReading(n, percent) {
  n.reading.hidden = percent === null;
  if (percent === null) return;
  n.reading.setAttribute("aria-valuenow", String(percent));
  n.readingBar.style.width = `${percent}%`;
  n.readingText.textContent = `Reading your message… ${percent}%`;
}

function assistantNodes() {
  const root = el("article", "msg msg-assistant");
  root.dataset.role = "assistant";
  const body = el("div", "msg-body md");
  const typing = el("div", "typing");
  typing.setAttribute("aria-label", "The model is writing");
  typing.append(el("span"), el("span"), el("span"));
  // A long prompt takes the server a while to read: how far it got, as a bar and in words.
  const reading = el("div", "reading");
  reading.setAttribute("role", "progressbar");
  reading.setAttribute("aria-valuemin", "0");
  reading.setAttribute("aria-valuemax", "100");
  const readingBar = el("span", "reading-bar");
  const readingText = el("span", "reading-text");
  reading.append(readingBar, readingText);
  reading.hidden = true;
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
  root.append(body, typing, reading, error, foot);
  return {
    root, body, typing, reading, readingBar, readingText, error, errorText, retry, foot,
    actions, meta, copy, regen,
  };
}

// A view of a Reply (reply.js). actions: onRegenerate(view), onRender() after each paint of
// new text (the page follows the stream), onSwitch(messageId), onRate(view, rating, comment)
// -> promise of the saved feedback.
export function assistantView(reply, { onRegenerate, onRender, onSwitch, onRate }) {
  const n = assistantNodes();
  n.root.dataset.messageId = reply.id;
  const md = new StreamingMarkdown(n.body, { onRender });
  const nav = branchNav({ onSwitch });
  const rating = feedbackControls({ onSave: (value, comment) => onRate(view, value, comment) });
  n.actions.append(...rating.buttons);
  n.foot.insertBefore(nav.root, n.meta);
  n.root.append(...rating.panel);
  const view = {
    kind: "assistant",
    id: reply.id,
    root: n.root,
    reply,
    nav,
    busy: false,
    paint() {
      const m = reply.message;
      const text = reply.content;
      const streaming = reply.streaming;
      n.root.dataset.status = streaming ? "streaming" : m.status;
      if (streaming) {
        md.set(text);
        n.body.setAttribute("aria-busy", "true");
      } else {
        if (!md.finished || md.text !== text) md.finish(text);
        n.body.removeAttribute("aria-busy");
      }
      n.typing.hidden = !(streaming && !text);
      paintReading(n, reply.readPercent);
      const problem = !streaming && (m.status === "failed" || m.status === "interrupted");
      n.error.hidden = !problem;
      if (problem) {
        n.errorText.textContent = m.error || STATUS_ERRORS[m.status];
        n.retry.hidden = m.retryable === false;
        n.retry.disabled = view.busy;
      }
      // While a reply streams only its versions show: the user may switch away (the reply
      // goes on streaming off the page).
      n.foot.hidden = streaming && !(m.siblings?.length > 1);
      n.actions.hidden = streaming;
      n.meta.textContent = streaming ? "" : formatMeta(m);
      n.copy.hidden = !text;
      n.regen.hidden = problem;
      n.regen.disabled = view.busy;
      rating.setHidden(streaming);
      if (view.shownSiblings !== m.siblings) {
        view.shownSiblings = m.siblings;
        nav.set(m.siblings, reply.id);
      }
    },
    setState({ busy, locked }) {
      view.busy = busy;
      nav.setLocked(locked);
      view.paint();
    },
    showFeedback(feedback) {
      reply.message.feedback = feedback;
      rating.show(feedback);
    },
    dispose() {
      reply.dispose();
    },
  };
  rating.show(reply.message.feedback);
  n.copy.addEventListener("click", () => flashCopied(n.copy, copyText(reply.content)));
  n.regen.addEventListener("click", () => onRegenerate(view));
  n.retry.addEventListener("click", () => onRegenerate(view));
  return view;
}

// Code block copy buttons (the Markdown renderer adds them; one listener serves all).
export function copyCodeOnClick(container) {
  container.addEventListener("click", (event) => {
    const button = event.target.closest(".copy-code");
    if (!button) return;
    const code = button.closest(".code-block")?.querySelector("code");
    copyText(code ? code.textContent.replace(/\n$/, "") : "").then((ok) => {
      button.textContent = ok ? "Copied" : "Copy failed";
      setTimeout(() => (button.textContent = "Copy"), 1500);
    });
  });
}

// The inline editor under a user message. onSubmit(text) resolves to true once the edit is
// sent (the conversation then replaces this message, form and all).
export function openEditForm(view, onSubmit) {
  const root = view.root;
  root.classList.add("editing");
  const form = el("form", "edit-form");
  const label = el("label", "visually-hidden", "Edit your message");
  const area = el("textarea");
  area.id = `edit-${view.id}`;
  label.htmlFor = area.id;
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
    if (isPlainEnter(event)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!area.value.trim()) return;
    save.disabled = true;
    if (!(await onSubmit(area.value))) save.disabled = false;
  });
}
