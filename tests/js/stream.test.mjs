// The event stream and resume logic (static/chat/stream.js) driving a Reply, against a fake
// server that resumes from Last-Event-ID like chat/sse.py.
import { test } from "node:test";
import assert from "node:assert/strict";

import { ConversationStream, HeldEvents } from "../../static/chat/stream.js";
import { Reply } from "../../static/chat/reply.js";
import { FakeClock, FakeServer, settle } from "./fakes.mjs";

const URL = "/events/conversations/1/";
const token = (seq) => ({ message_id: "m1", seq, text: `t${seq} ` });
const tokens = (from, to) => Array.from({ length: to - from }, (_, i) => `t${from + i} `).join("");
const message = (fields = {}) => ({ id: "m1", role: "assistant", content: "", status: "streaming", next_seq: 0, ...fields });

// The page in small: one reply, its stream, and a reload from the API on reset (the
// conversation view snapshots each reply from the conversation JSON).
function openPage({ saved = () => message(), canReconnect = async () => true } = {}) {
  const clock = new FakeClock();
  const server = new FakeServer();
  const reply = new Reply(saved(), { clock, fetchMessage: async () => saved() });
  const page = { clock, server, reply, statuses: [], resets: 0 };
  page.stream = new ConversationStream(URL, {
    onEvent: (type, data) => data.message_id === reply.id && reply.event(type, data),
    onReset: () => {
      page.resets += 1;
      reply.snapshot(saved());
    },
    onStatus: (status) => page.statuses.push(status),
    canReconnect,
  }, { EventSource: server.EventSource, clock });
  return page;
}

function publishTokens(server, from, to) {
  for (let seq = from; seq < to; seq++) server.publish("token", token(seq));
}

test("a new stream opens the conversation's events_url without a Last-Event-ID and goes live", async () => {
  const { server, stream, statuses } = openPage();
  assert.equal(server.latest.url, URL);
  server.accept();
  await stream.ready;
  assert.deepEqual(statuses, ["live"]);
});

test("after a lost connection the page resumes after the last event seen: each missed token once", async () => {
  let saved = message();
  const { clock, server, reply, statuses } = openPage({ saved: () => saved });
  server.accept();
  publishTokens(server, 0, 3);
  assert.equal(reply.content, tokens(0, 3));
  const lastSeen = server.latest.lastEventId;

  server.latest.drop();
  assert.deepEqual(statuses, ["live", "reconnecting"]);
  publishTokens(server, 3, 5); // sent while the page is away
  saved = message({ content: tokens(0, 2), next_seq: 2 }); // the saved text lags behind
  await clock.advance(1000);

  assert.equal(server.connections.length, 2);
  assert.equal(server.latest.url, `${URL}?lastEventId=${encodeURIComponent(lastSeen)}`);
  server.accept(); // replays tokens 3 and 4
  publishTokens(server, 5, 6);
  server.publish("message.end", { message_id: "m1", finish_reason: "stop" });
  assert.equal(reply.content, tokens(0, 6));
  assert.equal(reply.status, "complete");
  assert.equal(statuses.at(-1), "live");
});

test("stream-reset: the page reloads the saved message and shows no token twice", async () => {
  let saved = message();
  const page = openPage({ saved: () => saved });
  const { clock, server, reply } = page;
  server.accept();
  publishTokens(server, 0, 4);
  server.latest.readyState = 0; // dead without a word: only the silence gives it away
  publishTokens(server, 4, 6);
  server.forgetAll(); // the log no longer has what the page missed
  saved = message({ content: tokens(0, 6), next_seq: 6 });
  await clock.advance(50000);
  assert.equal(server.connections.length, 2);
  assert.equal(page.resets, 0);
  server.accept();
  await settle();

  assert.equal(page.resets, 1);
  assert.equal(reply.content, tokens(0, 6));
  server.latest.dispatch("token", JSON.stringify(token(5)), server.eventId(99)); // a resent token
  publishTokens(server, 6, 8);
  assert.equal(reply.content, tokens(0, 8));
});

test("stream-reset moves the resume point, so the next reconnect does not reset again", async () => {
  const { clock, server } = openPage();
  server.accept();
  publishTokens(server, 0, 2);
  server.latest.drop();
  publishTokens(server, 2, 3);
  server.forgetAll();
  await clock.advance(1000);
  server.accept(); // stream-reset carrying the newest id
  const resetId = server.latest.lastEventId;
  assert.equal(resetId, server.eventId(3));
  server.latest.drop();
  await clock.advance(2000); // the retry delay doubled
  assert.equal(server.latest.url, `${URL}?lastEventId=${encodeURIComponent(resetId)}`);
});

test("a connection silent past the keep-alive interval is replaced, resuming where it was", async () => {
  const { clock, server, statuses } = openPage();
  server.accept();
  publishTokens(server, 0, 1);
  await clock.advance(40000);
  server.latest.dispatch("keep-alive");
  await clock.advance(40000);
  assert.equal(server.connections.length, 1, "keep-alives keep the connection");
  await clock.advance(10001);
  assert.equal(server.connections.length, 2);
  assert.equal(server.connections[0].readyState, 2);
  assert.equal(server.latest.url, `${URL}?lastEventId=${encodeURIComponent(server.eventId(1))}`);
  assert.equal(statuses.at(-1), "reconnecting");
});

test("no reconnect once the conversation is gone or the session ended", async () => {
  const { clock, server, statuses } = openPage({ canReconnect: async () => false });
  server.accept();
  server.latest.drop();
  await clock.advance(1000);
  assert.equal(server.connections.length, 1);
  assert.equal(statuses.at(-1), "closed");
});

test("a closed stream neither reconnects nor delivers", async () => {
  const { clock, server, reply, stream } = openPage();
  server.accept();
  server.latest.drop();
  stream.close();
  await clock.advance(60000);
  assert.equal(server.connections.length, 1);
  assert.equal(clock.timers.size, 0);
  publishTokens(server, 0, 1);
  assert.equal(reply.content, "");
});

test("events of a reply not shown yet are held, then handed over in order", () => {
  const held = new HeldEvents(3);
  held.hold("token", token(0));
  held.hold("token", { message_id: "other", seq: 0, text: "x" });
  held.hold("token", token(1));
  assert.deepEqual(held.take("m1").map(([, data]) => data.seq), [0, 1]);
  assert.deepEqual(held.take("m1"), []);
  for (let seq = 0; seq < 5; seq++) held.hold("token", token(seq));
  assert.deepEqual(held.take("m1").map(([, data]) => data.seq), [2, 3, 4], "only the newest are kept");
});
