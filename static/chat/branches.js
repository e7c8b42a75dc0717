// The "‹ 2/3 ›" under a message that has other versions (siblings: the messages sharing its
// parent). Choosing one asks the conversation to switch its active path there.
import { el } from "./dom.js";

// onSwitch(messageId) switches the conversation to that sibling.
export function branchNav({ onSwitch }) {
  const root = el("div", "branch-nav");
  root.setAttribute("role", "group");
  root.setAttribute("aria-label", "Versions of this message");
  const prev = el("button", "branch-step prev", "‹");
  const next = el("button", "branch-step next", "›");
  const label = el("span", "branch-count");
  label.setAttribute("aria-live", "polite");
  for (const [button, text] of [[prev, "Previous version"], [next, "Next version"]]) {
    button.type = "button";
    button.setAttribute("aria-label", text);
    button.title = text;
  }
  root.append(prev, label, next);
  root.hidden = true;
  const state = { siblings: [], index: 0, locked: false };

  function paint() {
    const { siblings, index } = state;
    root.hidden = siblings.length < 2;
    label.textContent = `${index + 1}/${siblings.length}`;
    prev.disabled = state.locked || index <= 0;
    next.disabled = state.locked || index >= siblings.length - 1;
  }

  const step = (delta) => {
    const target = state.siblings[state.index + delta];
    if (target && !state.locked) onSwitch(target);
  };
  prev.addEventListener("click", () => step(-1));
  next.addEventListener("click", () => step(1));

  return {
    root,
    // siblings: ids, oldest first, this message among them.
    set(siblings, id) {
      state.siblings = siblings || [id];
      state.index = Math.max(0, state.siblings.indexOf(id));
      paint();
    },
    setLocked(locked) {
      state.locked = locked;
      paint();
    },
    // For the keyboard: true when there was a version that way.
    step(delta) {
      const possible = Boolean(state.siblings[state.index + delta]) && !state.locked;
      step(delta);
      return possible;
    },
    get hasVersions() {
      return state.siblings.length > 1;
    },
  };
}
