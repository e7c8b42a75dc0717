// One EventSource per open conversation, resumed from the last event seen.
// The EventSource constructor and the timers are passed in, so this runs under Node's test
// runner with fakes.
import { systemClock } from "./clock.js";

const EVENT_TYPES = ["message.start", "message.progress", "token", "message.end", "message.error"];
const SILENCE_LIMIT_MS = 50000; // keep-alives come every 20 s
const CLOSED = 2; // EventSource.CLOSED
const HELD_EVENTS_LIMIT = 5000;

export class ConversationStream {
  // handlers: onEvent(type, data), onReset(), onStatus(status), canReconnect() -> bool.
  constructor(url, handlers, { EventSource = globalThis.EventSource, clock = systemClock } = {}) {
    this.url = url;
    this.handlers = handlers;
    this.EventSource = EventSource;
    this.clock = clock;
    this.lastId = null;
    this.closed = false;
    this.retryDelay = 1000;
    this.ready = new Promise((resolve) => (this.resolveReady = resolve));
    this.connect();
  }

  connect() {
    if (this.closed) return;
    // ?lastEventId= because a new EventSource cannot be given a Last-Event-ID header.
    const url = this.lastId ? `${this.url}?lastEventId=${encodeURIComponent(this.lastId)}` : this.url;
    const source = (this.source = new this.EventSource(url));
    const current = () => !this.closed && source === this.source;
    source.addEventListener("stream-open", () => {
      this.retryDelay = 1000;
      this.resolveReady();
      this.setStatus("live");
      this.bump();
    });
    source.onopen = () => this.bump();
    source.onerror = () => {
      if (!current()) return;
      this.setStatus("reconnecting");
      // CONNECTING: the browser retries by itself, sending Last-Event-ID. CLOSED: it gave up.
      if (source.readyState === CLOSED) this.reconnectLater();
    };
    source.addEventListener("keep-alive", () => this.bump());
    source.addEventListener("stream-reset", (event) => {
      this.track(event);
      this.handlers.onReset();
    });
    for (const type of EVENT_TYPES) {
      source.addEventListener(type, (event) => {
        if (!current()) return;
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

  // A connection that stays silent past the keep-alive interval is dead without saying so.
  bump() {
    this.clock.clearTimeout(this.silenceTimer);
    if (this.closed) return;
    this.silenceTimer = this.clock.setTimeout(() => this.restart(), SILENCE_LIMIT_MS);
  }

  reconnectLater() {
    if (this.closed) return;
    this.clock.clearTimeout(this.retryTimer);
    this.source.close();
    this.retryTimer = this.clock.setTimeout(async () => {
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
    this.clock.clearTimeout(this.retryTimer);
    this.clock.clearTimeout(this.silenceTimer);
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

// Events for a reply the page does not show yet: the POST that creates it may still be on its
// way while its first tokens already arrive. They are replayed once the reply is shown.
export class HeldEvents {
  constructor(limit = HELD_EVENTS_LIMIT) {
    this.limit = limit;
    this.events = [];
  }

  hold(type, data) {
    this.events.push([type, data]);
    if (this.events.length > this.limit) this.events.shift();
  }

  take(messageId) {
    const mine = this.events.filter(([, data]) => data.message_id === messageId);
    this.events = this.events.filter(([, data]) => data.message_id !== messageId);
    return mine;
  }
}
