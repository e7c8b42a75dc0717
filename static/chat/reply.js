// One assistant reply as the page knows it: the message JSON, its text assembled exactly once
// from token events and API snapshots, and its move from streaming to complete, cancelled
// or failed. No DOM here: the view listens through onChange.
//
// `expected` is the next seq to apply; tokens below it are duplicates, tokens above it wait
// in `buffer` while the saved text is fetched (the saved text holds seq 0..next_seq-1).
import { systemClock } from "./clock.js";

const SILENT_REPLY_MS = 8000;

export class Reply {
  constructor(message, { fetchMessage, onChange, clock = systemClock } = {}) {
    this.clock = clock;
    this.id = message.id;
    this.message = { ...message };
    this.content = message.content || "";
    this.expected = message.next_seq || 0;
    this.status = message.status;
    this.buffer = new Map();
    // How far the server has read the prompt ({processed, total}), until the first text.
    this.progress = null;
    this.fetching = false;
    this.refetchTimer = null;
    this.lastActivity = clock.now();
    this.bind({ fetchMessage, onChange });
  }

  // A conversation reload builds new views but keeps live replies: they may be ahead of
  // the saved text. The new view takes the reply over here.
  bind({ fetchMessage = async () => null, onChange = () => {} } = {}) {
    this.fetchMessage = fetchMessage;
    this.onChange = onChange;
  }

  get streaming() {
    return this.status === "streaming";
  }

  get hasGap() {
    return this.buffer.size > 0;
  }

  event(type, data) {
    if (type === "token") this.token(data.seq, data.text);
    else if (type === "message.start") this.start(data);
    else if (type === "message.progress") this.prompted(data);
    else if (type === "message.end") this.end(data);
    else if (type === "message.error") this.fail(data);
  }

  token(seq, text) {
    this.lastActivity = this.clock.now();
    if (!this.streaming || seq < this.expected) return;
    if (seq === this.expected) {
      if (!this.hasGap) {
        this.clock.clearTimeout(this.refetchTimer);
        this.idleDelay = 1000;
      }
      this.content += text;
      this.expected += 1;
      this.drain();
      this.onChange();
    } else {
      this.buffer.set(seq, text);
      this.sync();
    }
  }

  drain() {
    for (const seq of this.buffer.keys()) if (seq < this.expected) this.buffer.delete(seq);
    while (this.buffer.has(this.expected)) {
      this.content += this.buffer.get(this.expected);
      this.buffer.delete(this.expected);
      this.expected += 1;
    }
  }

  start(data) {
    if (data.model) this.message.model = data.model;
  }

  // The server is still reading a long prompt: how far it got (it is alive, so no refetch).
  prompted(data) {
    this.lastActivity = this.clock.now();
    const { processed, total } = data;
    if (!this.streaming || this.content || !(total > 0) || !(processed >= 0)) return;
    if (this.progress && processed <= this.progress.processed) return; // an old one, replayed
    this.progress = { processed: Math.min(processed, total), total };
    this.onChange();
  }

  // The share of the prompt read, 0..100, while there is no text yet; null otherwise.
  get readPercent() {
    if (!this.streaming || this.content || !this.progress) return null;
    return Math.floor((100 * this.progress.processed) / this.progress.total);
  }

  end(data) {
    const m = this.message;
    Object.assign(m, {
      finish_reason: data.finish_reason,
      ttft_ms: data.ttft_ms ?? m.ttft_ms,
      tokens_per_second: data.tokens_per_second ?? m.tokens_per_second,
      model: data.model || m.model,
      completion_tokens: data.usage?.completion_tokens ?? m.completion_tokens,
      status: data.finish_reason === "cancelled" ? "cancelled" : "complete",
    });
    // Tokens are still missing: the reply ends when the saved text, which has them all, comes.
    if (this.hasGap || !this.streaming) {
      this.sync();
    } else {
      this.status = m.status;
      this.onChange();
    }
  }

  fail(data) {
    Object.assign(this.message, { status: "failed", error: data.error, retryable: data.retryable });
    this.status = "failed";
    this.onChange();
    this.sync(); // the saved partial text and final status
  }

  // Apply a message JSON from the API (page load, refetch, conversation reload).
  snapshot(message) {
    this.lastActivity = this.clock.now();
    if (message.status !== "streaming") {
      this.content = message.content || "";
      this.expected = message.next_seq ?? this.expected;
      this.buffer.clear();
      this.status = message.status;
    } else if ((message.next_seq || 0) >= this.expected) {
      this.content = message.content || "";
      this.expected = message.next_seq || 0;
      this.drain();
    }
    Object.assign(this.message, message);
    this.onChange();
    if (this.streaming && this.hasGap) this.scheduleRefetch();
  }

  // Fetch the saved message now (one request at a time).
  async sync() {
    if (this.fetching) return;
    this.fetching = true;
    this.clock.clearTimeout(this.refetchTimer);
    try {
      const message = await this.fetchMessage(this.id);
      if (message) {
        this.snapshot(message);
        // Still streaming and nothing newer than the saved text: the events we lack may
        // all have been sent already; look again (less often each time) until tokens come.
        if (this.streaming && !this.hasGap && (message.next_seq || 0) >= this.expected) {
          this.idleDelay = Math.min((this.idleDelay || 500) * 2, 8000);
          this.scheduleRefetch(this.idleDelay);
        }
      }
    } catch {
      this.scheduleRefetch(1500);
    } finally {
      this.fetching = false;
    }
  }

  scheduleRefetch(delay = 500) {
    this.clock.clearTimeout(this.refetchTimer);
    this.refetchTimer = this.clock.setTimeout(() => this.sync(), delay);
  }

  // A lost end event must never leave a reply spinning: after a silence, ask the API.
  checkSilence() {
    const now = this.clock.now();
    if (this.streaming && now - this.lastActivity > SILENT_REPLY_MS) {
      this.lastActivity = now;
      this.sync();
    }
  }

  dispose() {
    this.clock.clearTimeout(this.refetchTimer);
    this.bind();
  }
}
