// Small DOM builders shared by the views.

export const el = (tag, className, text) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
};

const icon = (paths) =>
  `<svg aria-hidden="true" viewBox="0 0 24 24" width="16" height="16">${paths}</svg>`;

export const ICONS = {
  copy: icon('<rect x="9" y="9" width="11" height="11" rx="2"/><path d="M5 15V5a2 2 0 0 1 2-2h8"/>'),
  regen: icon('<path d="M20 11a8 8 0 1 0-2.3 5.7M20 4v7h-7"/>'),
  edit: icon('<path d="M4 20h4L19 9l-4-4L4 16v4zM14 6l4 4"/>'),
  delete: icon('<path d="M5 7h14M10 11v6M14 11v6M7 7l1 13h8l1-13M9 7V4h6v3"/>'),
  thumbUp: icon('<path d="M7 11v9H4v-9h3zM7 11l4-7a2 2 0 0 1 3 2l-1 4h5a2 2 0 0 1 2 2.3l-1.2 6A2 2 0 0 1 16.8 20H7"/>'),
  thumbDown: icon('<path d="M7 13V4H4v9h3zM7 13l4 7a2 2 0 0 0 3-2l-1-4h5a2 2 0 0 0 2-2.3l-1.2-6A2 2 0 0 0 16.8 4H7"/>'),
};

export function actionButton(label, className, iconMarkup) {
  const button = el("button", `action ${className}`);
  button.type = "button";
  button.setAttribute("aria-label", label);
  button.title = label;
  button.innerHTML = iconMarkup; // static markup from ICONS, never model text
  return button;
}

// Enter sends, Shift+Enter makes a new line, and Enter that ends an IME composition only
// confirms the composed text.
export const isPlainEnter = (event) => event.key === "Enter" && !event.shiftKey && !event.isComposing;

// A click that should open a link in this page; with a modifier key or another button the
// browser does what the user asked (a new tab, a new window).
export const isPlainClick = (event) => !(event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0);
