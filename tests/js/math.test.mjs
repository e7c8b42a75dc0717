// KaTeX as math.js calls it: untrusted TeX never yields links, images, raw HTML or styles of
// its own (render.js also runs DOMPurify over the nodes in the browser).
import { test } from "node:test";
import assert from "node:assert/strict";

import katex from "../../static/vendor/katex/katex.mjs";
import { OPTIONS } from "../../static/chat/math.js";

const render = (tex, displayMode = false) => {
  try {
    return katex.renderToString(tex, { ...OPTIONS, displayMode });
  } catch (error) {
    return `error: ${error.message}`;
  }
};

test("inline and display formulas are typeset", () => {
  assert.match(render("e^{i\\pi}+1=0"), /class="katex"/);
  assert.match(render("\\int_0^1 x\\,dx", true), /class="katex-display"/);
});

test("commands that would link, load, or inject are refused", () => {
  for (const tex of [
    "\\href{javascript:alert(1)}{x}",
    "\\url{https://example.com}",
    "\\includegraphics{https://example.com/a.png}",
    "\\htmlClass{x}{y}",
    "\\htmlStyle{color:red;background:url(x)}{y}",
    "\\htmlId{x}{y}",
    "\\htmlData{a=b}{y}",
  ]) {
    const html = render(tex);
    assert.doesNotMatch(html, /href=|src=|url\(|javascript:|data-a=|id="x"/, tex);
  }
});

test("macro bombs and huge sizes are bounded", () => {
  const bomb = "\\def\\a{xxxxxxxxxx}\\def\\b{\\a\\a\\a\\a\\a\\a\\a\\a\\a\\a}\\def\\c{\\b\\b\\b\\b\\b\\b\\b\\b\\b\\b}\\c\\c\\c\\c\\c\\c";
  assert.match(render(bomb), /^error: .*(expansion|Too many)/i);
  assert.doesNotMatch(render("\\rule{1000em}{1000em}"), /1000em/);
});
