// Thumbs up/down on a reply, with an optional comment. The user's feedback is shown back:
// the pressed thumb, and the comment under the reply. Saving goes through onSave, which
// resolves to the saved feedback (or null when cleared) and throws with a message to show.
import { el, actionButton, ICONS } from "./dom.js";

export function feedbackControls({ onSave }) {
  const up = actionButton("Good reply", "rate-up", ICONS.thumbUp);
  const down = actionButton("Bad reply", "rate-down", ICONS.thumbDown);
  const note = el("div", "feedback-note");
  const noteText = el("span", "feedback-comment");
  const editNote = el("button", "link-button small", "Edit comment");
  editNote.type = "button";
  note.append(noteText, editNote);
  note.hidden = true;
  const form = el("form", "feedback-form");
  form.hidden = true;
  const label = el("label", "feedback-label", "Tell us more (optional)");
  const area = el("textarea");
  area.rows = 2;
  area.maxLength = 2000;
  label.append(area);
  const buttons = el("div", "edit-actions");
  const cancel = el("button", "button subtle small", "Close");
  cancel.type = "button";
  const save = el("button", "button primary small", "Save");
  save.type = "submit";
  buttons.append(cancel, save);
  const status = el("span", "feedback-status");
  status.setAttribute("role", "status");
  form.append(label, status, buttons);
  let current = null;

  function show(feedback) {
    current = feedback || null;
    const rating = current?.rating || null;
    up.setAttribute("aria-pressed", String(rating === "up"));
    down.setAttribute("aria-pressed", String(rating === "down"));
    noteText.textContent = current?.comment ? `Your comment: ${current.comment}` : "";
    note.hidden = !current?.comment || !form.hidden;
  }

  async function save_(rating, comment) {
    status.textContent = "Saving…";
    try {
      show(await onSave(rating, comment));
      status.textContent = "";
      return true;
    } catch (error) {
      status.textContent = error.message;
      form.hidden = false;
      return false;
    }
  }

  function openForm() {
    form.hidden = false;
    note.hidden = true;
    area.value = current?.comment || "";
    area.focus();
  }

  function closeForm() {
    form.hidden = true;
    status.textContent = "";
    show(current);
  }

  // Pressing the pressed thumb takes the rating back; the comment stays.
  for (const [button, rating] of [[up, "up"], [down, "down"]]) {
    button.addEventListener("click", async () => {
      const next = current?.rating === rating ? null : rating;
      if ((await save_(next, current?.comment || "")) && next) openForm();
    });
  }
  editNote.addEventListener("click", openForm);
  cancel.addEventListener("click", closeForm);
  area.addEventListener("keydown", (event) => event.key === "Escape" && closeForm());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    save.disabled = true;
    if (await save_(current?.rating || null, area.value.trim())) closeForm();
    save.disabled = false;
  });

  return {
    buttons: [up, down],
    panel: [note, form],
    show,
    setHidden(hidden) {
      up.hidden = down.hidden = hidden;
      if (hidden) note.hidden = form.hidden = true;
      else show(current);
    },
  };
}
