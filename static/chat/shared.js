// The read-only page of a share link: the snapshot's messages, rendered with the chat page's
// own Markdown and sanitising (render.js). Nothing here talks to the API.
import { el } from "./dom.js";
import { renderMarkdown } from "./render.js";
import { copyCodeOnClick } from "./messages.js";

const data = JSON.parse(document.getElementById("shared-conversation").textContent);
const container = document.getElementById("messages");

const NOTES = {
  streaming: "This reply was still being written when it was shared.",
  cancelled: "The reply was stopped.",
  failed: "The reply failed.",
  interrupted: "The reply was interrupted.",
};

function sharedMessage(message) {
  const root = el("article", `msg msg-${message.role === "user" ? "user" : "assistant"}`);
  root.dataset.role = message.role;
  if (message.role === "user") {
    root.append(el("div", "bubble", message.content));
    return root;
  }
  const body = el("div", "msg-body md");
  body.append(renderMarkdown(message.content));
  root.append(body);
  const note = NOTES[message.status];
  const meta = [message.model, note].filter(Boolean).join(" · ");
  if (meta) root.append(el("div", "msg-foot", meta));
  return root;
}

container.replaceChildren(...data.messages.map(sharedMessage));
copyCodeOnClick(container);
document.documentElement.dataset.ready = "1";
