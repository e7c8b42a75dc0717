// Test doubles for the page's stream and reply logic: a clock the test moves by hand, an
// EventSource, and a server that keeps an event log and resumes from Last-Event-ID like
// chat/sse.py does.

// Lets pending promise callbacks (a fetch answering, an await) run.
export const settle = () => new Promise((resolve) => setImmediate(resolve));

export class FakeClock {
  constructor() {
    this.time = 0;
    this.timers = new Map();
    this.nextId = 1;
  }

  now() {
    return this.time;
  }

  setTimeout(fn, ms = 0) {
    const id = this.nextId++;
    this.timers.set(id, { at: this.time + ms, fn });
    return id;
  }

  clearTimeout(id) {
    this.timers.delete(id);
  }

  // Move time forward, running each timer that falls due in order.
  async advance(ms) {
    const end = this.time + ms;
    for (;;) {
      const due = [...this.timers.entries()]
        .filter(([, timer]) => timer.at <= end)
        .sort((a, b) => a[1].at - b[1].at || a[0] - b[0])[0];
      if (!due) break;
      const [id, timer] = due;
      this.timers.delete(id);
      this.time = Math.max(this.time, timer.at);
      timer.fn();
      await settle();
    }
    this.time = end;
    await settle();
  }
}

// A server for one conversation: an event log with ids, connections that replay after the
// Last-Event-ID they bring, and a log that forgets old events (then: stream-reset).
export class FakeServer {
  constructor(channel = "conversation-1") {
    this.channel = channel;
    this.log = []; // [{ id, type, data }]
    this.nextId = 1;
    this.forgotten = 0; // ids <= this are gone from the log
    this.connections = [];
    const server = this;
    this.EventSource = class FakeEventSource {
      constructor(url) {
        this.url = url;
        this.readyState = 0;
        this.listeners = new Map();
        this.lastEventId = "";
        server.connections.push(this);
      }

      addEventListener(type, fn) {
        if (!this.listeners.has(type)) this.listeners.set(type, []);
        this.listeners.get(type).push(fn);
      }

      close() {
        this.readyState = 2;
      }

      // Dispatch as a browser does: an event without an id carries the last one seen.
      dispatch(type, data = "", id = null) {
        if (this.readyState === 2) return;
        if (id !== null) this.lastEventId = id;
        for (const fn of this.listeners.get(type) || []) fn({ type, data, lastEventId: this.lastEventId });
      }

      // The network drops the connection; CLOSED: the browser will not retry by itself.
      drop(readyState = 2) {
        this.readyState = readyState;
        this.onerror?.();
      }
    };
  }

  get latest() {
    return this.connections[this.connections.length - 1];
  }

  eventId(n) {
    return `${this.channel}:${n}`;
  }

  resumeAfter(url) {
    const query = new URL(url, "http://site").searchParams.get("lastEventId");
    return query ? Number(query.split(":").pop()) : null;
  }

  // Answer the newest connection: stream-open, then what it missed (or stream-reset).
  accept(connection = this.latest) {
    connection.readyState = 1;
    connection.onopen?.();
    connection.dispatch("stream-open");
    const after = this.resumeAfter(connection.url);
    if (after === null) return;
    if (after < this.forgotten) {
      connection.dispatch("stream-reset", JSON.stringify({ channels: [this.channel] }), this.eventId(this.nextId - 1));
      return;
    }
    for (const event of this.log) {
      if (event.id > after) connection.dispatch(event.type, event.data, this.eventId(event.id));
    }
  }

  publish(type, payload) {
    const event = { id: this.nextId++, type, data: JSON.stringify(payload) };
    this.log.push(event);
    for (const connection of this.connections) {
      if (connection.readyState === 1) connection.dispatch(event.type, event.data, this.eventId(event.id));
    }
  }

  forgetAll() {
    this.forgotten = this.nextId - 1;
    this.log = [];
  }
}
