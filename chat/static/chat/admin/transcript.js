// The admin's transcript page (templates/admin/chat/conversation/transcript.html), a file of
// its own because the admin's Content-Security-Policy allows no inline script.
// While a reply streams, re-read the transcript JSON (the relay saves text at least once a
// second) and refresh the streaming messages in place; a message that is new reloads the page.
(function () {
  const root = document.querySelector(".transcript");
  if (!root || root.dataset.streaming !== "true") return;
  const url = root.dataset.pollUrl;

  function figures(m) {
    const parts = [new Date(m.created_at).toISOString().replace("T", " ").slice(0, 19)];
    if (m.model) parts.push("model " + m.model);
    if (m.ttft_ms !== null) parts.push("TTFT " + m.ttft_ms + " ms");
    if (m.tokens_per_second !== null) parts.push(m.tokens_per_second.toFixed(1) + " tokens/s");
    if (m.finish_reason) parts.push("finish " + m.finish_reason);
    return parts;
  }

  function update(m) {
    const node = document.getElementById("msg-" + m.id);
    if (!node) return false;
    node.querySelector(".content").textContent = m.content;
    node.querySelector(".figures").textContent = figures(m).join(" · ");
    const badge = node.querySelector(".badge.status");
    if (badge) {
      badge.textContent = m.status;
      badge.className = "badge status " + m.status;
    }
    node.querySelector(".error").textContent = m.error ? "Error: " + m.error : "";
    return true;
  }

  async function poll() {
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!response.ok) return setTimeout(poll, 5000);
      const data = await response.json();
      if (!data.messages.every(update)) return location.reload();
      if (data.streaming) setTimeout(poll, 1000);
    } catch (err) {
      setTimeout(poll, 5000);
    }
  }
  setTimeout(poll, 1000);
})();
