// The usage and API key texts of the settings panel (static/chat/account.js), and the
// dashboard's server cells (static/chat/admin_usage.js).
import { test } from "node:test";
import assert from "node:assert/strict";

import { formatTokens, keyText, quotaLine, untilText, usageLines, utcText } from "../../static/chat/account.js";
import { serverCells } from "../../static/chat/admin_usage.js";

const NOW = Date.parse("2026-11-30T20:48:00Z");
const period = (total, replies = 2) => ({ prompt_tokens: total / 2, completion_tokens: total / 2, total_tokens: total, replies });

test("token counts read with thousands separators", () => {
  assert.equal(formatTokens(1234567), "1,234,567");
  assert.equal(formatTokens(undefined), "0");
});

test("a reset is given in UTC and as the time left", () => {
  assert.equal(utcText("2026-12-01T00:00:00+00:00"), "2026-12-01 00:00 UTC");
  assert.equal(untilText("2026-12-01T00:00:00+00:00", NOW), "in 3 h 12 min");
  assert.equal(untilText("2026-11-30T21:00:00+00:00", NOW), "in 12 min");
  assert.equal(untilText("2027-01-01T00:00:00+00:00", NOW), "in 31 days");
});

test("a quota line shows use against the limit, and no limit plainly", () => {
  const daily = { limit: 50000, used: 12500, remaining: 37500, set_by: "site", resets_at: "2026-12-01T00:00:00+00:00" };
  assert.deepEqual(quotaLine("Daily", daily, NOW), {
    label: "Daily quota",
    text: "12,500 of 50,000 tokens · resets 2026-12-01 00:00 UTC (in 3 h 12 min)",
    fraction: 0.25,
    over: false,
  });
  assert.equal(quotaLine("Daily", { ...daily, used: 60000 }, NOW).over, true);
  assert.equal(quotaLine("Daily", { ...daily, used: 60000 }, NOW).fraction, 1);
  const none = { limit: null, used: 3, remaining: null, set_by: "site", resets_at: "2026-12-01T00:00:00+00:00" };
  assert.deepEqual(quotaLine("Monthly", none, NOW), { label: "Monthly quota", text: "No limit", fraction: null, over: false });
});

test("usage lines: today, this month, then each quota", () => {
  const data = {
    today: period(100, 1),
    month: period(3000),
    quota: { daily: { limit: null }, monthly: { limit: 1e6, used: 3000, resets_at: "2026-12-01T00:00:00+00:00" } },
  };
  const lines = usageLines(data, NOW);
  assert.deepEqual(lines.map((l) => l.label), ["Today", "This month", "Daily quota", "Monthly quota"]);
  assert.equal(lines[0].text, "100 tokens · 1 reply (50 prompt, 50 completion)");
  assert.equal(lines[1].text, "3,000 tokens · 2 replies (1,500 prompt, 1,500 completion)");
});

test("a key shows its prefix, creation and last use, never a secret", () => {
  const key = { id: "k", name: "ci", prefix: "ts-AbCd1234", created_at: "2026-11-02T10:00:00+00:00", last_used_at: null };
  assert.equal(keyText(key), "ts-AbCd1234… · created 2026-11-02 · never used");
  assert.equal(keyText({ ...key, last_used_at: "2026-11-30T20:01:09+00:00" }), "ts-AbCd1234… · created 2026-11-02 · last used 2026-11-30 20:01 UTC");
});

test("server cells: ready or why not, and blanks for gauges a server lacks", () => {
  assert.deepEqual(serverCells({ ready: true, status: "ready", model: "m", running: 2, queue: 0 }),
    { state: "ready", ready: true, model: "m", running: "2", queue: "0" });
  assert.deepEqual(serverCells({ ready: false, status: "unreachable", model: "", running: null, queue: null }),
    { state: "unreachable", ready: false, model: "", running: "–", queue: "–" });
});
