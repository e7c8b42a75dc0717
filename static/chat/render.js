// Markdown for model output: marked -> DOMPurify -> DOM, with highlighted code blocks.
// Model text is never put into the page as HTML without DOMPurify, raw HTML in the
// Markdown is shown as text, and nothing that loads remote content survives.
import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import hljs from "../vendor/highlight/highlight.min.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

const MAX_HIGHLIGHT = 60000;
const MAX_AUTO_HIGHLIGHT = 8000;

function codeLanguage(info) {
  return (info || "").trim().split(/\s+/)[0].toLowerCase().replace(/[^\w+#.-]/g, "").slice(0, 30);
}

function makeMarked({ highlight, auto }) {
  const md = new Marked({ gfm: true, breaks: false });
  md.use({
    renderer: {
      // Raw HTML written by the model is shown as the text it is.
      html(token) {
        return escapeHtml(token.raw ?? token.text ?? "");
      },
      // Images would load remote content: show a link to them instead.
      image(token) {
        const label = escapeHtml(token.text || "image");
        return `<a href="${escapeHtml(token.href || "")}">[${label}]</a>`;
      },
      code(token) {
        const lang = codeLanguage(token.lang);
        const text = token.text || "";
        let body = null;
        let cls = "hljs";
        if (highlight && text.length <= MAX_HIGHLIGHT) {
          try {
            if (lang && hljs.getLanguage(lang)) {
              body = hljs.highlight(text, { language: lang, ignoreIllegals: true }).value;
            } else if (!lang && auto && text.length <= MAX_AUTO_HIGHLIGHT) {
              body = hljs.highlightAuto(text).value;
            }
          } catch {
            body = null;
          }
        }
        if (body === null) body = escapeHtml(text);
        if (lang) cls += ` language-${lang}`;
        return `<pre data-lang="${escapeHtml(lang)}"><code class="${cls}">${body}\n</code></pre>\n`;
      },
    },
  });
  return md;
}

const finalMarked = makeMarked({ highlight: true, auto: true });
const liveMarked = makeMarked({ highlight: true, auto: false });
const plainMarked = makeMarked({ highlight: false, auto: false });

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

export function toFragment(html) {
  return decorate(DOMPurify.sanitize(html, PURIFY));
}

export function renderMarkdown(text) {
  return toFragment(finalMarked.parse(text || ""));
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
    const tail = this.text.slice(this.committed);
    const md = tail.length > 20000 ? plainMarked : liveMarked;
    const tokens = md.lexer(tail);
    let last = tokens.length - 1;
    while (last > 0 && tokens[last].type === "space") last--;
    if (last > 0) {
      const finished = tokens.slice(0, last);
      finished.links = tokens.links;
      this.done.append(toFragment(finalMarked.parser(finished)));
      this.committed += finished.reduce((n, token) => n + token.raw.length, 0);
    }
    const open = tokens.slice(Math.max(last, 0));
    open.links = tokens.links;
    this.live.replaceChildren(toFragment(md.parser(open)));
    const cost = performance.now() - started;
    this.nextAt = performance.now() + Math.min(cost * 3, 400);
    this.onRender();
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
