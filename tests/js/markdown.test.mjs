// Model text to HTML (static/chat/markdown.js); render.js sanitises the result in the browser.
import { test } from "node:test";
import assert from "node:assert/strict";

import { markdownHtml, streamingHtml } from "../../static/chat/markdown.js";

test("Markdown too deeply nested for the parser is shown as escaped plain text", () => {
  const deep = ">".repeat(3000) + " deep <b>end</b> & more";
  const html = markdownHtml(deep);
  assert.match(html, /^<p class="md-plain">/);
  assert.ok(html.includes("&gt;".repeat(3000) + " deep &lt;b&gt;end&lt;/b&gt; &amp; more"));
  assert.ok(!html.includes("<b>") && !html.includes("<blockquote>"));
});

test("the streaming renderer refuses such text, so the page falls back for that message", () => {
  assert.throws(() => streamingHtml(">".repeat(3000) + " deep"), RangeError);
});

test("ordinary Markdown is rendered, and nested quotes within reason still are", () => {
  assert.equal(markdownHtml("**bold**"), "<p><strong>bold</strong></p>\n");
  assert.equal((markdownHtml(">".repeat(50) + " q").match(/<blockquote>/g) || []).length, 50);
});

test("raw HTML is shown as text and images become links", () => {
  const html = markdownHtml('<img src=x onerror="alert(1)"> ![pic](http://example.com/a.png)');
  assert.ok(!html.includes("<img"));
  assert.ok(html.includes("&lt;img src=x"));
  assert.ok(html.includes('<a href="http://example.com/a.png">[pic]</a>'));
});

test("code blocks are highlighted with their language named", () => {
  const html = markdownHtml("```python\ndef hello():\n    return 1\n```");
  assert.match(html, /<pre data-lang="python"><code class="hljs language-python">/);
  assert.match(html, /<span class="hljs-keyword">def<\/span>/);
});

test("a streamed text splits into finished blocks, rendered once, and the open last block", () => {
  const part = streamingHtml("# Title\n\nfirst paragraph\n\nstill wri");
  assert.equal(part.done, "<h1>Title</h1>\n<p>first paragraph</p>\n");
  assert.equal(part.doneLength, "# Title\n\nfirst paragraph\n\n".length);
  assert.equal(part.open, "<p>still wri</p>\n");
  assert.equal(streamingHtml("only one block").done, null);
});

test("math becomes placeholders holding the TeX source, escaped", () => {
  const html = markdownHtml("Euler: $e^{i\\pi}+1<2$ and \\(a\\)\n\n$$\n\\int_0^1 x\\,dx\n$$\n");
  assert.match(html, /<span class="math math-inline" data-tex="e\^\{i\\pi\}\+1&lt;2">\$e\^\{i\\pi\}\+1&lt;2\$<\/span>/);
  assert.match(html, /<span class="math math-inline" data-tex="a">/);
  assert.match(html, /<div class="math math-display" data-tex="\\int_0\^1 x\\,dx">/);
});

test("money, code and escaped dollars are not math", () => {
  for (const text of ["costs $5 and $10 today", "`$x$` in code", "```\n$$x$$\n```", "\\$5 and \\$6", "a $ b $ c"]) {
    assert.doesNotMatch(markdownHtml(text), /class="math/, text);
  }
});

test("math in a paragraph stays in it, and an unclosed formula is plain text while streaming", () => {
  assert.equal(markdownHtml("a $$x^2$$ b").trim(),
    '<p>a <span class="math math-display" data-tex="x^2">$$x^2$$</span> b</p>');
  const part = streamingHtml("done $x$\n\nstill open $y");
  assert.match(part.done, /data-tex="x"/);
  assert.doesNotMatch(part.open, /class="math/);
});

test("TeX that tries to be HTML stays text inside the placeholder", () => {
  const html = markdownHtml('$<img src=x onerror="alert(1)">$');
  assert.doesNotMatch(html, /<img/);
  assert.match(html, /data-tex="&lt;img src=x onerror=&quot;alert\(1\)&quot;&gt;"/);
});
