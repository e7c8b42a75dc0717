// Model text to HTML with marked and highlight.js. No DOM here (render.js sanitises it and
// builds the nodes), so this runs under Node's test runner too.
import { Marked } from "../vendor/marked/marked.esm.js";
import hljs from "../vendor/highlight/highlight.min.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

const MAX_HIGHLIGHT = 60000;
const MAX_AUTO_HIGHLIGHT = 8000;
const LIVE_PLAIN_AFTER = 20000; // chars in the open tail: stop highlighting while streaming

function codeLanguage(info) {
  return (info || "").trim().split(/\s+/)[0].toLowerCase().replace(/[^\w+#.-]/g, "").slice(0, 30);
}

function highlighted(text, lang, { highlight, auto }) {
  if (!highlight || text.length > MAX_HIGHLIGHT) return null;
  try {
    if (lang && hljs.getLanguage(lang)) {
      return hljs.highlight(text, { language: lang, ignoreIllegals: true }).value;
    }
    if (!lang && auto && text.length <= MAX_AUTO_HIGHLIGHT) return hljs.highlightAuto(text).value;
  } catch {
    // An unhighlighted block is still a correct one.
  }
  return null;
}

// Math: $…$ and \(…\) inline, $$…$$ and \[…\] displayed. Only a placeholder holding the
// TeX source is made here (the source as its text, so it reads as it was written until
// math.js typesets it): the HTML sanitiser never has to let KaTeX's markup through.
const INLINE_MATH = [
  // $…$ as pandoc reads it: no space inside either dollar, and no digit right after the
  // closing one, so "$5 and $10" stays money.
  [/^\$(?![\s$])((?:\\.|[^\\\n$])+?)(?<![\s\\])\$(?!\d)/, false],
  [/^\$\$(?!\$)([\s\S]+?)\$\$/, true],
  [/^\\\(([\s\S]+?)\\\)/, false],
  [/^\\\[([\s\S]+?)\\\]/, true],
];
const BLOCK_MATH = [/^ {0,3}\$\$([\s\S]+?)\$\$ *(?:\n+|$)/, /^ {0,3}\\\[([\s\S]+?)\\\] *(?:\n+|$)/];

// block: a paragraph of its own (a div); otherwise a span, shown as a block when displayed.
export function mathPlaceholder(tex, display, block = false) {
  const tag = block ? "div" : "span";
  const mark = display ? ["$$", "$$"] : ["$", "$"];
  const cls = display ? "math math-display" : "math math-inline";
  return `<${tag} class="${cls}" data-tex="${escapeHtml(tex)}">${escapeHtml(mark[0] + tex + mark[1])}</${tag}>`;
}

const mathExtension = {
  extensions: [
    {
      name: "mathBlock",
      level: "block",
      // Where a display block could interrupt a paragraph: only at the start of a line.
      start(src) {
        const match = src.match(/\n {0,3}(?:\$\$|\\\[)/);
        return match ? match.index + 1 : undefined;
      },
      tokenizer(src) {
        for (const pattern of BLOCK_MATH) {
          const match = pattern.exec(src);
          if (match && match[1].trim()) return { type: "mathBlock", raw: match[0], text: match[1].trim() };
        }
        return undefined;
      },
      renderer: (token) => mathPlaceholder(token.text, true, true) + "\n",
    },
    {
      name: "mathInline",
      level: "inline",
      start: (src) => src.match(/\$|\\[([]/)?.index,
      tokenizer(src) {
        for (const [pattern, display] of INLINE_MATH) {
          const match = pattern.exec(src);
          if (match && match[1].trim()) {
            return { type: "mathInline", raw: match[0], text: match[1].trim(), display };
          }
        }
        return undefined;
      },
      renderer: (token) => mathPlaceholder(token.text, token.display),
    },
  ],
};

function makeMarked(options) {
  const md = new Marked({ gfm: true, breaks: false });
  md.use(mathExtension);
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
        const body = highlighted(text, lang, options) ?? escapeHtml(text);
        const cls = lang ? `hljs language-${lang}` : "hljs";
        return `<pre data-lang="${escapeHtml(lang)}"><code class="${cls}">${body}\n</code></pre>\n`;
      },
    },
  });
  return md;
}

const finalMarked = makeMarked({ highlight: true, auto: true });
const liveMarked = makeMarked({ highlight: true, auto: false });
const plainMarked = makeMarked({ highlight: false, auto: false });

// Text marked cannot parse (3,000 nested `>` overflow its recursion) is shown as it is.
export function plainHtml(text) {
  return `<p class="md-plain">${escapeHtml(text || "")}</p>`;
}

// The whole of a finished reply; never throws.
export function markdownHtml(text) {
  try {
    return finalMarked.parse(text || "");
  } catch {
    return plainHtml(text);
  }
}

// The tail of a streaming reply, split into the blocks that are finished (rendered once, as
// they will stay: `done` is null when none is) and the open last block (re-rendered with each
// token). `doneLength` is how many chars of the tail the finished blocks hold.
// Throws when marked cannot parse the text.
export function streamingHtml(tail) {
  const md = tail.length > LIVE_PLAIN_AFTER ? plainMarked : liveMarked;
  const tokens = md.lexer(tail);
  let last = tokens.length - 1;
  while (last > 0 && tokens[last].type === "space") last--;
  let done = null;
  let doneLength = 0;
  if (last > 0) {
    const finished = tokens.slice(0, last);
    finished.links = tokens.links;
    done = finalMarked.parser(finished);
    doneLength = finished.reduce((n, token) => n + token.raw.length, 0);
  }
  const open = tokens.slice(Math.max(last, 0));
  open.links = tokens.links;
  return { done, doneLength, open: md.parser(open) };
}
