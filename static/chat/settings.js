// The conversation settings panel: system prompt, model, temperature, max tokens. Before a
// new chat's first message they are kept as a draft, sent when the conversation is created.
import * as api from "./api.js";

export class Settings {
  // fields: { system, model, temperature, maxTokens }. current() -> the open conversation's
  // JSON or null. onSaved(conversation) with the API's answer.
  constructor({ panel, form, status, toggle, cancel, fields, current, onSaved }) {
    Object.assign(this, { panel, status, toggle, fields, current, onSaved });
    this.draft = {};
    this.modelsLoaded = false;
    const closeAndReturn = () => {
      this.close();
      toggle.focus();
    };
    toggle.addEventListener("click", () => (panel.hidden ? this.open() : this.close()));
    cancel.addEventListener("click", closeAndReturn);
    panel.addEventListener("keydown", (event) => {
      if (event.key === "Escape") closeAndReturn();
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.save();
    });
  }

  open() {
    this.panel.hidden = false;
    this.toggle.setAttribute("aria-expanded", "true");
    this.status.textContent = this.current() ? "" : "These settings apply to the new chat when you send its first message.";
    this.loadModels();
    this.fields.system.focus();
  }

  close() {
    this.panel.hidden = true;
    this.toggle.setAttribute("aria-expanded", "false");
  }

  clearDraft() {
    this.draft = {};
  }

  fill(conversation) {
    this.fields.system.value = conversation.system_prompt || "";
    this.setModel(conversation.model || "");
    this.fields.temperature.value = conversation.temperature ?? "";
    this.fields.maxTokens.value = conversation.max_tokens ?? "";
  }

  // A conversation may name a model the server no longer lists: keep it choosable.
  setModel(value) {
    const select = this.fields.model;
    if (value && ![...select.options].some((o) => o.value === value)) select.append(new Option(value, value));
    select.value = value || "";
  }

  async loadModels() {
    if (this.modelsLoaded) return;
    try {
      const data = await api.listModels();
      this.modelsLoaded = true;
      const chosen = this.fields.model.value;
      const options = [new Option("Server default", "")];
      for (const model of data.models || []) {
        const label = model.context_length ? `${model.id} (${model.context_length} tokens)` : model.id;
        options.push(new Option(label, model.id));
      }
      this.fields.model.replaceChildren(...options);
      this.setModel(chosen);
    } catch (error) {
      this.status.textContent = `Couldn't load the model list: ${error.message}`;
    }
  }

  read() {
    const number = (input, integer) => {
      const raw = input.value.trim();
      if (!raw) return null;
      const value = Number(raw);
      if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
        throw new Error(`${input.labels[0].textContent} must be ${integer ? "a whole number" : "a number"}.`);
      }
      return value;
    };
    const { system, model, temperature, maxTokens } = this.fields;
    return {
      system_prompt: system.value,
      model: model.value,
      temperature: number(temperature, false),
      max_tokens: number(maxTokens, true),
    };
  }

  async save() {
    let values;
    try {
      values = this.read();
    } catch (error) {
      this.status.textContent = error.message;
      return;
    }
    if (!this.current()) {
      this.draft = values;
      this.status.textContent = "Saved for this new chat.";
      return;
    }
    const id = this.current().id;
    this.status.textContent = "Saving…";
    try {
      const updated = await api.updateConversation(id, values);
      if (this.current()?.id === id) {
        this.onSaved(updated);
        this.fill(updated);
      }
      this.status.textContent = "Saved.";
    } catch (error) {
      this.status.textContent = error.message;
    }
  }
}
