// Model output into the page: HTML from markdown.js -> DOMPurify -> DOM, with code blocks
// decorated. Model text is never put into the page as HTML without DOMPurify, and nothing
// that loads remote content survives. A message whose Markdown cannot be rendered is shown as
// plain text, and only that message.
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import { markdownHtml, streamingHtml } from "./markdown.js";
import { typeset } from "./math.js";

const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: [
    "img", "style", "iframe", "form", "input", "video", "audio", "source", "object", "embed",
    "svg", "math", "link", "meta", "base", "picture", "track", "button", "textarea", "select",
    "frame", "frameset", "script", "template", "dialog",
  ],
  FORBID_ATTR: [
    "src", "srcset", "style", "action", "formaction", "poster", "background", "ping",
    "xlink:href", "id", "name",
  ],
  ALLOW_UNKNOWN_PROTOCOLS: false,
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A") {
    const href = node.getAttribute("href") || "";
    if (!/^(https?:\/\/|mailto:)/i.test(href.trim())) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

function decorate(fragment) {
  for (const pre of fragment.querySelectorAll("pre")) {
    const lang = pre.getAttribute("data-lang") || "";
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.className = "code-lang";
    label.textContent = lang || "code";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy-code";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", `Copy ${lang || ""} code`.replace("  ", " "));
    head.append(label, copy);
    pre.replaceWith(wrap);
    wrap.append(head, pre);
  }
  for (const table of fragment.querySelectorAll("table")) {
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    table.replaceWith(wrap);
    wrap.append(table);
  }
  return fragment;
}

function toFragment(html) {
  const fragment = decorate(DOMPurify.sanitize(html, PURIFY));
  typeset(fragment);
  return fragment;
}

function plainFragment(text) {
  const fragment = document.createDocumentFragment();
  const p = document.createElement("p");
  p.className = "md-plain";
  p.textContent = text || "";
  fragment.append(p);
  return fragment;
}

export function renderMarkdown(text) {
  try {
    return toFragment(markdownHtml(text));
  } catch (error) {
    console.warn("Markdown rendering failed; showing the message as plain text.", error);
    return plainFragment(text);
  }
}

const normalize = (text) => (text || "").replace(/\r\n?/g, "\n");

// A reply being streamed: finished Markdown blocks are rendered once and kept; only the
// last, unfinished block is re-rendered, at most once per animation frame, and less often
// when rendering gets expensive. finish() renders the whole text once, exactly.
export class StreamingMarkdown {
  constructor(element, { onRender } = {}) {
    this.el = element;
    this.onRender = onRender || (() => {});
    this.reset();
  }

  reset() {
    this.text = "";
    this.committed = 0;
    this.done = document.createElement("div");
    this.done.className = "md-done";
    this.live = document.createElement("div");
    this.live.className = "md-live";
    this.el.replaceChildren(this.done, this.live);
    this.finished = false;
    this.plain = false;
    this.pending = false;
    this.nextAt = 0;
  }

  set(text) {
    text = normalize(text);
    if (this.finished || !text.startsWith(this.text.slice(0, this.committed))) this.reset();
    if (text === this.text) return;
    this.text = text;
    this.schedule();
  }

  schedule() {
    if (this.pending || this.finished) return;
    this.pending = true;
    const wait = Math.max(0, this.nextAt - performance.now());
    const run = () => {
      if (!this.pending) return;
      this.pending = false;
      this.frame();
    };
    setTimeout(() => requestAnimationFrame(run), wait);
  }

  frame() {
    if (this.finished) return;
    const started = performance.now();
    if (!this.plain) {
      try {
        this.renderTail();
      } catch (error) {
        console.warn("Markdown rendering failed; showing the message as plain text.", error);
        this.plain = true;
      }
    }
    if (this.plain) {
      this.done.replaceChildren();
      this.live.replaceChildren(plainFragment(this.text));
    }
    const cost = performance.now() - started;
    this.nextAt = performance.now() + Math.min(cost * 3, 400);
    this.onRender();
  }

  renderTail() {
    const part = streamingHtml(this.text.slice(this.committed));
    if (part.done !== null) {
      this.done.append(toFragment(part.done));
      this.committed += part.doneLength;
    }
    this.live.replaceChildren(toFragment(part.open));
  }

  finish(text) {
    this.pending = false;
    this.finished = true;
    this.text = normalize(text);
    this.el.replaceChildren(renderMarkdown(this.text));
    this.onRender();
  }
}

export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    area.remove();
    return ok;
  }
}
