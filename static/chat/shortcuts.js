// Keyboard shortcuts, listed in a small help dialog. Keys that could be typed text act only
// when focus is not in a text box; the ones with modifiers act anywhere.

export const isTyping = (target) =>
  Boolean(target?.closest?.("input, textarea, select, [contenteditable='true']"));

// What a key press asks for, or null. Exported for the tests.
export function shortcutFor(event) {
  const mod = event.ctrlKey || event.metaKey;
  const key = event.key;
  if (mod && event.shiftKey && (key === "O" || key === "o")) return "new-chat";
  if (key === "Escape" && event.shiftKey) return "focus-composer";
  if (key === "Escape" && !mod && !event.altKey) return "stop";
  if (mod || event.altKey || isTyping(event.target)) return null;
  return { "/": "focus-composer", "[": "previous-version", "]": "next-version", "?": "help" }[key] ?? null;
}

// actions: { "new-chat", "focus-composer", "stop", "previous-version", "next-version", "help" }:
// each returns false when it did nothing (the key then keeps its usual meaning).
export function installShortcuts({ dialog, toggle, actions }) {
  const help = () => (dialog.open ? dialog.close() : dialog.showModal());
  toggle.addEventListener("click", help);
  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.isComposing) return;
    const name = shortcutFor(event);
    if (!name) return;
    // Esc belongs to an open dialog, an edit box or a menu before it means Stop.
    if (name === "stop" && (document.querySelector("dialog[open]") || (isTyping(event.target) && event.target.id !== "prompt"))) return;
    const run = name === "help" ? help : actions[name];
    if (run && run() !== false) event.preventDefault();
  });
}
