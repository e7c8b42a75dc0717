// Presets: the assistants staff prepared, offered as cards on a new chat's empty page. The
// choice goes to the conversation settings (settings.js), which send it with the new chat.
import * as api from "./api.js";
import { el } from "./dom.js";

export class PresetPicker {
  // container: where the cards go. onChoose(id or null).
  constructor({ container, onChoose }) {
    Object.assign(this, { container, onChoose });
    this.presets = [];
    this.chosen = null;
    this.loaded = null;
  }

  // Resolves to the list once loaded (an empty list if the server could not say).
  load() {
    this.loaded ??= api.listPresets().then(
      (data) => {
        this.presets = data.presets || [];
        this.render();
        return this.presets;
      },
      () => {
        this.loaded = null;
        return [];
      },
    );
    return this.loaded;
  }

  byId(id) {
    return this.presets.find((preset) => preset.id === id) || null;
  }

  card(preset) {
    const button = el("button", "preset-card");
    button.type = "button";
    button.dataset.presetId = preset ? String(preset.id) : "";
    button.append(el("span", "preset-name", preset ? preset.name : "No preset"));
    const about = preset ? preset.description : "The model's plain defaults.";
    if (about) button.append(el("span", "preset-about", about));
    button.addEventListener("click", () => this.onChoose(preset ? preset.id : null));
    return button;
  }

  render() {
    this.container.replaceChildren(this.card(null), ...this.presets.map((p) => this.card(p)));
    this.container.hidden = this.presets.length === 0;
    this.mark(this.chosen);
  }

  mark(id) {
    this.chosen = id ?? null;
    for (const button of this.container.querySelectorAll(".preset-card")) {
      button.setAttribute("aria-pressed", String(button.dataset.presetId === String(this.chosen ?? "")));
    }
  }
}
