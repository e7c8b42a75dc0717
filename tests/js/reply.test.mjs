// The Reply object (static/chat/reply.js): exactly-once text and the moves from streaming to
// complete, cancelled and failed.
import { test } from "node:test";
import assert from "node:assert/strict";

import { Reply } from "../../static/chat/reply.js";
import { FakeClock, settle } from "./fakes.mjs";

const message = (fields = {}) => ({ id: "m1", role: "assistant", content: "", status: "streaming", next_seq: 0, ...fields });
const token = (seq) => ({ message_id: "m1", seq, text: `t${seq} ` });
const tokens = (from, to) => Array.from({ length: to - from }, (_, i) => `t${from + i} `).join("");

// A reply with an API that answers `saved()`, counting fetches and changes.
function makeReply(initial = message(), saved = () => null) {
  const clock = new FakeClock();
  const seen = { fetches: 0, changes: 0 };
  const reply = new Reply(initial, {
    clock,
    fetchMessage: async () => {
      seen.fetches += 1;
      const answer = saved();
      if (answer instanceof Error) throw answer;
      return answer;
    },
    onChange: () => (seen.changes += 1),
  });
  return { reply, clock, seen };
}

test("tokens are applied in seq order, each once; duplicates and old seqs are ignored", () => {
  const { reply, seen } = makeReply();
  for (const seq of [0, 1, 1, 0, 2]) reply.event("token", token(seq));
  assert.equal(reply.content, tokens(0, 3));
  assert.equal(reply.expected, 3);
  assert.equal(seen.fetches, 0);
});

test("a page loaded mid-reply continues from next_seq: tokens the saved text holds are skipped", () => {
  const { reply } = makeReply(message({ content: tokens(0, 4), next_seq: 4 }));
  for (let seq = 0; seq < 6; seq++) reply.event("token", token(seq));
  assert.equal(reply.content, tokens(0, 6));
});

test("a gap waits for the saved text, then the held tokens follow it", async () => {
  const { reply, seen } = makeReply(message(), () => message({ content: tokens(0, 3), next_seq: 3 }));
  reply.event("token", token(0));
  reply.event("token", token(3)); // 1 and 2 were missed
  reply.event("token", token(4));
  assert.equal(reply.content, tokens(0, 1));
  await settle();
  assert.equal(seen.fetches, 1, "one fetch at a time");
  assert.equal(reply.content, tokens(0, 5));
  assert.equal(reply.hasGap, false);
});

test("a saved text older than what is shown does not take tokens away", () => {
  const { reply } = makeReply();
  for (let seq = 0; seq < 5; seq++) reply.event("token", token(seq));
  reply.snapshot(message({ content: tokens(0, 2), next_seq: 2 }));
  assert.equal(reply.content, tokens(0, 5));
  reply.event("token", token(5));
  assert.equal(reply.content, tokens(0, 6));
});

test("message.start names the model", () => {
  const { reply } = makeReply();
  reply.event("message.start", { message_id: "m1", model: "fake" });
  assert.equal(reply.message.model, "fake");
  assert.ok(reply.streaming);
});

test("message.end completes the reply with its figures, without asking the API", () => {
  const { reply, seen } = makeReply();
  reply.event("token", token(0));
  reply.event("message.end", {
    message_id: "m1", finish_reason: "length", ttft_ms: 120, tokens_per_second: 33.3,
    model: "fake", usage: { prompt_tokens: 5, completion_tokens: 1 },
  });
  assert.equal(reply.status, "complete");
  assert.equal(reply.streaming, false);
  assert.deepEqual(
    [reply.message.status, reply.message.finish_reason, reply.message.ttft_ms, reply.message.tokens_per_second, reply.message.completion_tokens, reply.message.model],
    ["complete", "length", 120, 33.3, 1, "fake"],
  );
  assert.equal(seen.changes, 2);
  assert.equal(seen.fetches, 0);
  reply.event("token", token(1));
  assert.equal(reply.content, tokens(0, 1), "no tokens after the end");
});

test("message.end after Stop: cancelled", () => {
  const { reply } = makeReply();
  reply.event("message.end", { message_id: "m1", finish_reason: "cancelled", usage: {} });
  assert.equal(reply.status, "cancelled");
  assert.equal(reply.message.status, "cancelled");
});

test("message.end while tokens are missing: the reply ends with the saved text", async () => {
  let saved = message({ content: tokens(0, 1), next_seq: 1 }); // not saved yet: token 1
  const { reply, seen } = makeReply(message(), () => saved);
  reply.event("token", token(0));
  reply.event("token", token(2));
  await settle();
  assert.equal(seen.fetches, 1);
  assert.ok(reply.hasGap);
  saved = message({ content: tokens(0, 3), next_seq: 3, status: "complete", finish_reason: "stop" });
  reply.event("message.end", { message_id: "m1", finish_reason: "stop", usage: {} });
  assert.ok(reply.streaming, "not complete before the missing token is in");
  await settle();
  assert.equal(seen.fetches, 2);
  assert.equal(reply.status, "complete");
  assert.equal(reply.content, tokens(0, 3));
});

test("message.error fails the reply with its message and retryable flag, then shows the saved part", async () => {
  let saved = message({ content: tokens(0, 2), next_seq: 2, status: "failed", error: "The model server went away.", retryable: true });
  const { reply, seen } = makeReply(message(), () => saved);
  reply.event("token", token(0));
  reply.event("message.error", { message_id: "m1", error: "The model server went away.", retryable: true });
  assert.equal(reply.status, "failed");
  assert.equal(reply.streaming, false);
  assert.equal(reply.message.error, "The model server went away.");
  assert.equal(reply.message.retryable, true);
  await settle();
  assert.equal(seen.fetches, 1);
  assert.equal(reply.content, tokens(0, 2));

  saved = message({ status: "failed", error: "Bad request.", retryable: false });
  const other = makeReply(message(), () => saved).reply;
  other.event("message.error", { message_id: "m1", error: "Bad request.", retryable: false });
  assert.equal(other.message.retryable, false);
});

test("a reply silent for 8 s is checked against the API, and ends if the end event was lost", async () => {
  const saved = message({ content: tokens(0, 1), next_seq: 1, status: "complete" });
  const { reply, clock, seen } = makeReply(message(), () => saved);
  reply.event("token", token(0));
  await clock.advance(7000);
  reply.checkSilence();
  assert.equal(seen.fetches, 0);
  await clock.advance(1001);
  reply.checkSilence();
  await settle();
  assert.equal(seen.fetches, 1);
  assert.equal(reply.status, "complete");
});

test("while the saved text has nothing new, the API is asked again, less often each time", async () => {
  const { reply, clock, seen } = makeReply(message(), () => message());
  await reply.sync();
  assert.equal(seen.fetches, 1);
  await clock.advance(999);
  assert.equal(seen.fetches, 1);
  await clock.advance(1);
  assert.equal(seen.fetches, 2);
  await clock.advance(1999);
  assert.equal(seen.fetches, 2);
  await clock.advance(1);
  assert.equal(seen.fetches, 3);
  reply.event("token", token(0)); // tokens flow again: no more polling
  await clock.advance(60000);
  assert.equal(seen.fetches, 3);
});

test("a failed fetch is retried", async () => {
  let answer = new Error("offline");
  const { reply, clock, seen } = makeReply(message(), () => answer);
  reply.event("token", token(1));
  await settle();
  assert.equal(seen.fetches, 1);
  answer = message({ content: tokens(0, 1), next_seq: 1 });
  await clock.advance(1500);
  assert.equal(seen.fetches, 2);
  assert.equal(reply.content, tokens(0, 2));
});

test("a disposed reply stops fetching and telling its old view", async () => {
  const { reply, clock, seen } = makeReply(message(), () => message());
  reply.event("token", token(2));
  reply.dispose();
  await clock.advance(60000);
  assert.equal(seen.fetches, 1);
  const changes = seen.changes;
  reply.event("token", token(0));
  assert.equal(seen.changes, changes);
});

test("bind hands a live reply to a new view", () => {
  const { reply } = makeReply();
  let painted = 0;
  reply.bind({ onChange: () => (painted += 1) });
  reply.event("token", token(0));
  assert.equal(painted, 1);
});

const progress = (processed, total = 400) => ({ message_id: "m1", processed, total });

test("a long prompt's progress shows until the first text, never going back", () => {
  const { reply, seen } = makeReply();
  assert.equal(reply.readPercent, null);
  reply.event("message.progress", progress(100));
  assert.equal(reply.readPercent, 25);
  reply.event("message.progress", progress(300));
  reply.event("message.progress", progress(200)); // replayed after a reconnect: older
  assert.equal(reply.readPercent, 75);
  assert.equal(seen.changes, 2);
  reply.event("token", token(0));
  assert.equal(reply.readPercent, null);
  reply.event("message.progress", progress(399));
  assert.equal(reply.readPercent, null);
  assert.equal(reply.content, tokens(0, 1));
});

test("progress that makes no sense, or comes after the end, shows nothing", () => {
  const { reply } = makeReply();
  for (const bad of [progress(5, 0), progress(-1), { message_id: "m1" }]) reply.event("message.progress", bad);
  assert.equal(reply.readPercent, null);
  reply.event("message.end", { finish_reason: "stop" });
  reply.event("message.progress", progress(10));
  assert.equal(reply.readPercent, null);
});

test("a reply whose prompt is still being read is not mistaken for a silent one", async () => {
  const { reply, clock, seen } = makeReply(message(), () => message());
  for (let second = 1; second <= 20; second++) {
    await clock.advance(1000);
    reply.event("message.progress", progress(second * 10));
    reply.checkSilence();
  }
  await settle();
  assert.equal(seen.fetches, 0);
  assert.equal(reply.readPercent, 50);
});
