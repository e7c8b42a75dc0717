// Which key press asks for what (static/chat/shortcuts.js): one-key shortcuts never fire while
// the user types in a box; the ones with modifiers and Esc do.
import { test } from "node:test";
import assert from "node:assert/strict";

import { shortcutFor } from "../../static/chat/shortcuts.js";

const box = { closest: (selector) => (selector.includes("textarea") ? {} : null) };
const page = { closest: () => null };
const key = (k, extra = {}) => ({ key: k, target: page, ctrlKey: false, metaKey: false, altKey: false, shiftKey: false, ...extra });

test("keys outside a text box", () => {
  assert.equal(shortcutFor(key("/")), "focus-composer");
  assert.equal(shortcutFor(key("[")), "previous-version");
  assert.equal(shortcutFor(key("]")), "next-version");
  assert.equal(shortcutFor(key("?", { shiftKey: true })), "help");
  assert.equal(shortcutFor(key("a")), null);
});

test("typing in a box keeps its keys; modifiers and Esc still work", () => {
  for (const k of ["/", "[", "]", "?"]) assert.equal(shortcutFor(key(k, { target: box })), null, k);
  assert.equal(shortcutFor(key("Escape", { target: box })), "stop");
  assert.equal(shortcutFor(key("Escape", { target: box, shiftKey: true })), "focus-composer");
  assert.equal(shortcutFor(key("O", { target: box, ctrlKey: true, shiftKey: true })), "new-chat");
  assert.equal(shortcutFor(key("o", { metaKey: true, shiftKey: true })), "new-chat");
  assert.equal(shortcutFor(key("[", { ctrlKey: true })), null);
});
