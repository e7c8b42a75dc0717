// The conversation settings panel: preset, system prompt, model, temperature, max tokens,
// and the sampling settings against repetition (one input each, marked data-knob).
// Before a new chat's first message they are kept as a draft, sent when the conversation is
// created. The header's badge names the preset in use; a system prompt of the chat's own
// replaces the preset's.
import * as api from "./api.js";

const SYSTEM_PLACEHOLDER = "Optional instructions for the model";

export class Settings {
  // fields: { preset, system, model, temperature, maxTokens, knobs: [inputs] }; hint: the line under the
  // system prompt; badge: the header's preset name. presets: a PresetPicker (the list).
  // current() -> the open conversation's JSON or null. onSaved(conversation) with the API's
  // answer.
  constructor({ panel, form, status, toggle, cancel, fields, hint, badge, presets, current, onSaved }) {
    Object.assign(this, { panel, status, toggle, fields, hint, badge, presets, current, onSaved });
    this.draft = {};
    this.conversationPreset = null; // the open conversation's preset (it may be retired)
    fields.preset.addEventListener("change", () => this.paintPreset());
    badge.addEventListener("click", () => this.open());
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
    this.presets.load().then(() => this.fillPresets());
    this.fields.system.focus();
  }

  // The preset choice: active presets, and the conversation's own even if retired since.
  fillPresets() {
    const select = this.fields.preset;
    const chosen = select.value;
    const options = [new Option("None", "")];
    for (const preset of this.presets.presets) options.push(new Option(preset.name, String(preset.id)));
    const own = this.conversationPreset;
    if (own && !this.presets.byId(own.id)) options.push(new Option(`${own.name} (retired)`, String(own.id)));
    select.replaceChildren(...options);
    select.value = chosen;
    this.paintPreset();
  }

  presetInfo(id) {
    if (!id) return null;
    if (this.conversationPreset?.id === id) return this.conversationPreset;
    return this.presets.byId(id);
  }

  // A preset picked on the empty page of a new chat.
  choosePreset(id) {
    if (this.current()) return;
    this.draft = { ...this.draft, preset: id };
    if (id && ![...this.fields.preset.options].some((o) => o.value === String(id))) this.fillPresets();
    this.fields.preset.value = id ? String(id) : "";
    this.paintPreset();
  }

  // The badge, the picker's mark and what the system prompt box says of the preset.
  paintPreset() {
    const id = Number(this.fields.preset.value) || null;
    const preset = this.presetInfo(id);
    this.badge.hidden = !preset;
    this.badge.textContent = preset ? preset.name : "";
    this.badge.title = preset ? `Preset: ${preset.name}${preset.description ? ` — ${preset.description}` : ""}` : "";
    this.badge.setAttribute("aria-label", preset ? `Preset ${preset.name}: open the settings` : "");
    this.presets.mark(this.current() ? null : id);
    const prompt = preset?.system_prompt || "";
    this.fields.system.placeholder = prompt ? `From the preset: ${prompt}` : SYSTEM_PLACEHOLDER;
    this.hint.hidden = !prompt;
    this.hint.textContent = prompt ? `Left empty, the preset “${preset.name}” gives the instructions. Anything you write here replaces them for this chat.` : "";
  }

  close() {
    this.panel.hidden = true;
    this.toggle.setAttribute("aria-expanded", "false");
  }

  clearDraft() {
    this.draft = {};
  }

  fill(conversation) {
    this.conversationPreset = conversation.preset || null;
    const presetId = conversation.preset?.id ?? (conversation.id ? null : this.draft.preset ?? null);
    if (presetId && ![...this.fields.preset.options].some((o) => o.value === String(presetId))) {
      this.fields.preset.append(new Option(this.presetInfo(presetId)?.name || "Preset", String(presetId)));
    }
    this.fields.preset.value = presetId ? String(presetId) : "";
    this.paintPreset();
    this.fields.system.value = conversation.system_prompt || "";
    this.setModel(conversation.model || "");
    this.fields.temperature.value = conversation.temperature ?? "";
    this.fields.maxTokens.value = conversation.max_tokens ?? "";
    for (const input of this.fields.knobs) input.value = conversation[input.dataset.knob] ?? "";
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
    const { preset, system, model, temperature, maxTokens } = this.fields;
    return {
      preset: Number(preset.value) || null,
      system_prompt: system.value,
      model: model.value,
      temperature: number(temperature, false),
      max_tokens: number(maxTokens, true),
      ...Object.fromEntries(
        this.fields.knobs.map((input) => [input.dataset.knob, number(input, "integer" in input.dataset)]),
      ),
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
