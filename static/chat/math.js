// Typesetting of the math placeholders markdown.js leaves ([data-tex]) with KaTeX. KaTeX
// builds the nodes itself (styles through CSSOM, which the page's CSP allows), untrusted:
// no links, no raw HTML, no classes or styles from the TeX, and bounded sizes and macro
// expansion. DOMPurify then checks the result as well. KaTeX is loaded on first use only.
import DOMPurify from "../vendor/dompurify/purify.es.mjs";

const KATEX_URL = new URL("../vendor/katex/katex.mjs", import.meta.url).href;
export const OPTIONS = {
  throwOnError: true, // a formula KaTeX cannot read stays the text it was written as
  output: "html",
  trust: false,
  strict: "ignore",
  maxSize: 20,
  maxExpand: 500,
};
const CHECK = {
  IN_PLACE: true,
  USE_PROFILES: { html: true, svg: true },
  FORBID_TAGS: ["a", "img", "image", "use", "foreignObject", "script", "style", "iframe", "form"],
  FORBID_ATTR: ["href", "xlink:href", "src", "action", "formaction", "id", "name"],
};

let katex = null;
let loading = null;

function typesetOne(node) {
  const tex = node.dataset.tex;
  const display = node.classList.contains("math-display");
  node.removeAttribute("data-tex");
  try {
    const holder = document.createElement("span");
    katex.render(tex, holder, { ...OPTIONS, displayMode: display });
    DOMPurify.sanitize(holder, CHECK);
    node.replaceChildren(...holder.childNodes);
    // The HTML rendering reads poorly aloud: screen readers get the TeX source instead.
    node.setAttribute("role", "img");
    node.setAttribute("aria-label", tex);
    node.classList.add("math-done");
  } catch {
    node.classList.add("math-error");
    node.title = "This formula could not be typeset.";
  }
}

// Typeset the placeholders under root now if KaTeX is loaded; otherwise load it and then
// typeset whatever placeholders the page holds by then.
export function typeset(root) {
  const nodes = root.querySelectorAll(".math[data-tex]");
  if (!nodes.length) return;
  if (katex) {
    nodes.forEach(typesetOne);
    return;
  }
  loading ??= import(KATEX_URL).then(
    (module) => {
      katex = module.default;
      document.querySelectorAll(".math[data-tex]").forEach(typesetOne);
    },
    (error) => {
      loading = null;
      console.warn("KaTeX could not be loaded; formulas stay as text.", error);
    },
  );
}
