// The conversation settings panel: system prompt, model, temperature, max tokens. Before a
// new chat's first message they are kept as a draft, sent when the conversation is created.
import * as api from "./api.js";

// fields: { system, model, temperature, maxTokens }. current() -> the open conversation's
// JSON or null. onSaved(conversation) with the API's answer.
export function createSettings({ panel, form, status, toggle, cancel, fields, current, onSaved }) {
  let draft = {};
  let modelsLoaded = false;

  function setModelValue(value) {
    if (value && ![...fields.model.options].some((o) => o.value === value)) {
      fields.model.append(new Option(value, value));
    }
    fields.model.value = value || "";
  }

  async function loadModels() {
    if (modelsLoaded) return;
    try {
      const data = await api.listModels();
      modelsLoaded = true;
      const chosen = fields.model.value;
      const options = [new Option("Server default", "")];
      for (const model of data.models || []) {
        const label = model.context_length ? `${model.id} (${model.context_length} tokens)` : model.id;
        options.push(new Option(label, model.id));
      }
      fields.model.replaceChildren(...options);
      setModelValue(chosen);
    } catch (error) {
      status.textContent = `Couldn't load the model list: ${error.message}`;
    }
  }

  function fill(conversation) {
    fields.system.value = conversation.system_prompt || "";
    setModelValue(conversation.model || "");
    fields.temperature.value = conversation.temperature ?? "";
    fields.maxTokens.value = conversation.max_tokens ?? "";
  }

  function read() {
    const number = (input, integer) => {
      const raw = input.value.trim();
      if (!raw) return null;
      const value = Number(raw);
      if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
        throw new Error(`${input.labels[0].textContent} must be ${integer ? "a whole number" : "a number"}.`);
      }
      return value;
    };
    return {
      system_prompt: fields.system.value,
      model: fields.model.value,
      temperature: number(fields.temperature, false),
      max_tokens: number(fields.maxTokens, true),
    };
  }

  function open() {
    panel.hidden = false;
    toggle.setAttribute("aria-expanded", "true");
    status.textContent = current() ? "" : "These settings apply to the new chat when you send its first message.";
    loadModels();
    fields.system.focus();
  }

  function close() {
    panel.hidden = true;
    toggle.setAttribute("aria-expanded", "false");
  }

  const closeAndReturn = () => {
    close();
    toggle.focus();
  };

  async function save() {
    let values;
    try {
      values = read();
    } catch (error) {
      status.textContent = error.message;
      return;
    }
    if (!current()) {
      draft = values;
      status.textContent = "Saved for this new chat.";
      return;
    }
    const id = current().id;
    status.textContent = "Saving…";
    try {
      const updated = await api.updateConversation(id, values);
      if (current()?.id === id) {
        onSaved(updated);
        fill(updated);
      }
      status.textContent = "Saved.";
    } catch (error) {
      status.textContent = error.message;
    }
  }

  toggle.addEventListener("click", () => (panel.hidden ? open() : close()));
  cancel.addEventListener("click", closeAndReturn);
  panel.addEventListener("keydown", (event) => {
    if (event.key === "Escape") closeAndReturn();
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    save();
  });

  return {
    close,
    fill,
    draft: () => draft,
    clearDraft() {
      draft = {};
    },
  };
}
