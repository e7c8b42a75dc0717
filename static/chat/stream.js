// One EventSource per open conversation, and the exactly-once bookkeeping for replies.

const EVENT_TYPES = ["message.start", "token", "message.end", "message.error"];
const SILENCE_LIMIT_MS = 50000; // keep-alives come every 20 s

export class ConversationStream {
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    this.lastId = null;
    this.closed = false;
    this.retryDelay = 1000;
    this.ready = new Promise((resolve) => (this.resolveReady = resolve));
    this.connect();
  }

  connect() {
    if (this.closed) return;
    const url = this.lastId ? `${this.url}?lastEventId=${encodeURIComponent(this.lastId)}` : this.url;
    const source = (this.source = new EventSource(url));
    source.addEventListener("stream-open", () => {
      this.retryDelay = 1000;
      this.resolveReady();
      this.setStatus("live");
      this.bump();
    });
    source.onopen = () => this.bump();
    source.onerror = () => {
      if (this.closed || source !== this.source) return;
      this.setStatus("reconnecting");
      if (source.readyState === EventSource.CLOSED) this.reconnectLater();
    };
    source.addEventListener("keep-alive", () => this.bump());
    source.addEventListener("stream-reset", (event) => {
      this.track(event);
      this.handlers.onReset();
    });
    for (const type of EVENT_TYPES) {
      source.addEventListener(type, (event) => {
        if (this.closed || source !== this.source) return;
        this.track(event);
        const data = parse(event.data);
        if (data && data.message_id) this.handlers.onEvent(type, data);
      });
    }
  }

  track(event) {
    this.bump();
    if (event.lastEventId) this.lastId = event.lastEventId;
  }

  // A silent connection (no keep-alive for too long) is treated as dead.
  bump() {
    clearTimeout(this.silenceTimer);
    if (this.closed) return;
    this.silenceTimer = setTimeout(() => {
      if (this.closed) return;
      this.restart();
    }, SILENCE_LIMIT_MS);
  }

  reconnectLater() {
    if (this.closed) return;
    clearTimeout(this.retryTimer);
    this.source.close();
    this.retryTimer = setTimeout(async () => {
      if (this.closed) return;
      const go = await (this.handlers.canReconnect?.() ?? true);
      if (!go) {
        this.setStatus("closed");
        return;
      }
      this.connect();
      // Whatever happened while no stream was open, the API has it.
      this.ready.then(() => !this.closed && this.handlers.onReset());
    }, this.retryDelay);
    this.retryDelay = Math.min(this.retryDelay * 2, 30000);
  }

  restart() {
    if (this.closed) return;
    this.setStatus("reconnecting");
    this.source.close();
    this.connect();
  }

  setStatus(status) {
    if (this.status === status) return;
    this.status = status;
    this.handlers.onStatus?.(status);
  }

  close() {
    this.closed = true;
    clearTimeout(this.retryTimer);
    clearTimeout(this.silenceTimer);
    this.source?.close();
    this.resolveReady();
  }
}

function parse(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

// Exactly-once assembly of one reply's text from token events and API snapshots.
// `expected` is the next seq to apply; tokens below it are duplicates, tokens above it
// wait in `buffer` while the saved text is fetched (it holds seq 0..next_seq-1).
export class ReplyText {
  constructor(message, { fetchMessage, onChange }) {
    this.id = message.id;
    this.content = message.content || "";
    this.expected = message.next_seq || 0;
    this.status = message.status;
    this.buffer = new Map();
    this.fetchMessage = fetchMessage;
    this.onChange = onChange;
    this.fetching = false;
    this.refetchTimer = null;
    this.lastActivity = performance.now();
  }

  get streaming() {
    return this.status === "streaming";
  }

  token(seq, text) {
    this.lastActivity = performance.now();
    if (!this.streaming || seq < this.expected) return;
    if (seq === this.expected) {
      if (!this.hasGap) {
        clearTimeout(this.refetchTimer);
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

  get hasGap() {
    return this.buffer.size > 0;
  }

  // Apply a message JSON from the API (page load, refetch, conversation reload).
  snapshot(message) {
    this.lastActivity = performance.now();
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
    this.onChange(message);
    if (this.streaming && this.hasGap) this.scheduleRefetch();
  }

  // Fetch the saved message now (one request at a time).
  async sync() {
    if (this.fetching) return;
    this.fetching = true;
    clearTimeout(this.refetchTimer);
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
    clearTimeout(this.refetchTimer);
    this.refetchTimer = setTimeout(() => this.sync(), delay);
  }

  dispose() {
    clearTimeout(this.refetchTimer);
    this.fetchMessage = async () => null;
    this.onChange = () => {};
  }
}
