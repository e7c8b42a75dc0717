// The account part of the settings panel: the user's token usage and quotas, and their API
// keys (create, list, revoke; a new key's secret is shown once). Loaded each time the
// panel opens, so the figures are those of the replies ended so far.
import * as api from "./api.js";
import { el } from "./dom.js";

export const formatTokens = (n) => Number(n || 0).toLocaleString("en-US");

// "in 3 h 12 min" / "in 45 min" until an ISO time, from `now` (ms since the epoch).
export function untilText(iso, now) {
  const minutes = Math.max(1, Math.round((Date.parse(iso) - now) / 60000));
  const hours = Math.floor(minutes / 60);
  if (hours >= 48) return `in ${Math.round(hours / 24)} days`;
  return hours ? `in ${hours} h ${minutes % 60} min` : `in ${minutes} min`;
}

// "2026-12-01 00:00 UTC"
export const utcText = (iso) => new Date(iso).toISOString().slice(0, 16).replace("T", " ") + " UTC";

export function periodText(figures) {
  const replies = `${formatTokens(figures.replies)} repl${figures.replies === 1 ? "y" : "ies"}`;
  return `${formatTokens(figures.total_tokens)} tokens · ${replies} (${formatTokens(figures.prompt_tokens)} prompt, ${formatTokens(figures.completion_tokens)} completion)`;
}

// One quota as { label, text, fraction (0-1, or null without a limit), over }.
export function quotaLine(name, quota, now) {
  const label = `${name} quota`;
  if (!quota || quota.limit === null || quota.limit === undefined) {
    return { label, text: "No limit", fraction: null, over: false };
  }
  const over = quota.used >= quota.limit;
  const reset = `resets ${utcText(quota.resets_at)} (${untilText(quota.resets_at, now)})`;
  return {
    label,
    text: `${formatTokens(quota.used)} of ${formatTokens(quota.limit)} tokens · ${reset}`,
    fraction: Math.min(1, quota.used / quota.limit),
    over,
  };
}

export function usageLines(data, now) {
  return [
    { label: "Today", text: periodText(data.today), fraction: null, over: false },
    { label: "This month", text: periodText(data.month), fraction: null, over: false },
    quotaLine("Daily", data.quota.daily, now),
    quotaLine("Monthly", data.quota.monthly, now),
  ];
}

export function keyText(key) {
  const used = key.last_used_at ? `last used ${key.last_used_at.slice(0, 16).replace("T", " ")} UTC` : "never used";
  return `${key.prefix}… · created ${key.created_at.slice(0, 10)} · ${used}`;
}

export class Account {
  // ui: { usage, keyList, keyForm, keyName, secretBox, secretValue, copy, status, apiBase }.
  constructor(ui, { now = () => Date.now() } = {}) {
    Object.assign(this, { ui, now });
    ui.apiBase.textContent = `${location.origin}/v1`;
    ui.keyForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.createKey();
    });
    ui.copy.addEventListener("click", () => this.copySecret());
  }

  async load() {
    this.ui.status.textContent = "";
    await Promise.all([this.loadUsage(), this.loadKeys()]);
  }

  async loadUsage() {
    try {
      this.renderUsage(await api.getUsage());
    } catch (error) {
      this.ui.usage.replaceChildren(el("p", "account-error", `Couldn't load your usage: ${error.message}`));
    }
  }

  renderUsage(data) {
    const rows = usageLines(data, this.now()).map((line) => {
      const row = el("div", `usage-row${line.over ? " over" : ""}`);
      row.append(el("span", "usage-label", line.label), el("span", "usage-text", line.text));
      if (line.fraction !== null) {
        const meter = el("meter", "usage-meter");
        Object.assign(meter, { min: 0, max: 1, low: 0.75, high: 0.9, optimum: 0, value: line.fraction });
        meter.setAttribute("aria-label", `${line.label}: ${line.text}`);
        row.append(meter);
      }
      return row;
    });
    this.ui.usage.replaceChildren(...rows);
  }

  async loadKeys() {
    try {
      this.renderKeys((await api.listKeys()).keys);
    } catch (error) {
      this.ui.status.textContent = `Couldn't load your API keys: ${error.message}`;
    }
  }

  renderKeys(keys) {
    const items = keys.map((key) => {
      const li = el("li", "key-item");
      li.dataset.id = key.id;
      const text = el("div", "key-text");
      text.append(el("strong", "key-name", key.name), el("span", "key-meta", keyText(key)));
      const revoke = el("button", "button small subtle key-revoke", "Revoke");
      revoke.type = "button";
      revoke.setAttribute("aria-label", `Revoke the key “${key.name}”`);
      revoke.addEventListener("click", () => this.revokeKey(key));
      li.append(text, revoke);
      return li;
    });
    if (!items.length) items.push(el("li", "key-empty", "No API keys yet."));
    this.ui.keyList.replaceChildren(...items);
  }

  async createKey() {
    const name = this.ui.keyName.value.trim();
    try {
      const created = await api.createKey(name);
      this.ui.keyName.value = "";
      this.ui.status.textContent = "";
      // the list holds the new key by the time its secret shows (loadKeys never throws)
      await this.loadKeys();
      this.ui.secretValue.textContent = created.key;
      this.ui.secretBox.hidden = false;
    } catch (error) {
      this.ui.status.textContent = error.message;
    }
  }

  async copySecret() {
    try {
      await navigator.clipboard.writeText(this.ui.secretValue.textContent);
      this.ui.status.textContent = "Key copied.";
    } catch {
      this.ui.status.textContent = "Select the key and copy it by hand.";
    }
  }

  async revokeKey(key) {
    if (!window.confirm(`Revoke “${key.name}”? Programs using it will stop working.`)) return;
    try {
      await api.revokeKey(key.id);
      this.ui.status.textContent = `Revoked “${key.name}”.`;
      await this.loadKeys();
    } catch (error) {
      this.ui.status.textContent = error.message;
    }
  }

  // The secret is shown once: it is gone when the panel closes.
  forgetSecret() {
    this.ui.secretValue.textContent = "";
    this.ui.secretBox.hidden = true;
  }
}
