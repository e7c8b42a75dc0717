// The share dialog: create a read-only link to the conversation as it is now, copy it,
// update it to the latest messages, or stop sharing (the link is then a 404 for good).
import * as api from "./api.js";
import { copyText } from "./render.js";

export class ShareDialog {
  // ui: { dialog, showOwner, link, url, copy, create, revoke, status }. current() -> the open
  // conversation's JSON; onChanged(conversationId, share or null) once the server saved it.
  constructor({ ui, current, onChanged }) {
    Object.assign(this, { ui, current, onChanged });
    ui.create.addEventListener("click", () => this.share());
    ui.revoke.addEventListener("click", () => this.revoke());
    ui.copy.addEventListener("click", async () => {
      const ok = await copyText(ui.url.value);
      ui.status.textContent = ok ? "Link copied." : "Copy failed: select the link and copy it.";
    });
  }

  open() {
    const conversation = this.current();
    if (!conversation) return;
    this.ui.status.textContent = "";
    this.paint(conversation.share);
    this.ui.dialog.showModal();
  }

  paint(share) {
    const { ui } = this;
    ui.link.hidden = !share;
    ui.revoke.hidden = !share;
    ui.url.value = share ? new URL(share.url, location.origin).href : "";
    ui.create.textContent = share ? "Update link" : "Create link";
    if (share) ui.showOwner.checked = share.show_owner;
  }

  async share() {
    const conversation = this.current();
    if (!conversation) return;
    this.ui.status.textContent = "Saving…";
    try {
      const share = await api.shareConversation(conversation.id, this.ui.showOwner.checked);
      this.onChanged(conversation.id, share);
      this.paint(share);
      this.ui.status.textContent = "The link shows the conversation as it is now.";
      this.ui.url.select();
    } catch (error) {
      this.ui.status.textContent = error.message;
    }
  }

  async revoke() {
    const conversation = this.current();
    if (!conversation) return;
    try {
      await api.stopSharing(conversation.id);
      this.onChanged(conversation.id, null);
      this.paint(null);
      this.ui.status.textContent = "Sharing stopped: the link no longer works.";
    } catch (error) {
      this.ui.status.textContent = error.message;
    }
  }
}
