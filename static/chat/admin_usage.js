// The usage dashboard's live table of inference servers: polls servers.json (each server's
// /ready and /metrics, asked by the site) every few seconds while the page is open.
const POLL_MS = 5000;

export function serverCells(server) {
  const state = server.ready ? "ready" : server.status || "down";
  const number = (value) => (value === null || value === undefined ? "–" : String(Math.round(value)));
  return {
    state,
    ready: Boolean(server.ready),
    model: server.model || "",
    running: number(server.running),
    queue: number(server.queue),
  };
}

function paint(table, servers) {
  for (const server of servers) {
    const row = [...table.tBodies[0].rows].find((r) => r.dataset.url === server.url);
    if (!row) continue;
    const cells = serverCells(server);
    const [, state, model, running, queue] = row.cells;
    state.textContent = cells.state;
    state.className = cells.ready ? "state-ready" : "state-down";
    model.textContent = cells.model;
    running.textContent = cells.running;
    queue.textContent = cells.queue;
  }
  table.dataset.checked = "1";
}

async function poll(table, url) {
  try {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (response.ok) paint(table, (await response.json()).servers);
  } catch {
    // The next poll tries again; the table keeps its last known state.
  }
  setTimeout(() => poll(table, url), POLL_MS);
}

const table = typeof document !== "undefined" && document.getElementById("usage-servers");
if (table) poll(table, new URL("servers.json", window.location.href).toString());
