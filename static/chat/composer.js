// The message box with its Send and Stop buttons.
import { isPlainEnter } from "./dom.js";

// canSend() -> bool; send(text) -> promise of false when the text was not sent;
// stop() -> null when nothing streams, else a promise that settles once the stop is asked.
export function createComposer({ form, prompt, sendButton, stopButton, canSend, send, stop }) {
  let controls = { busy: false, streaming: false };

  function autosize() {
    prompt.style.height = "auto";
    prompt.style.height = `${Math.min(prompt.scrollHeight, Math.round(window.innerHeight * 0.4))}px`;
  }

  function paint() {
    stopButton.hidden = !controls.streaming;
    sendButton.hidden = controls.streaming;
    sendButton.disabled = controls.busy || !prompt.value.trim();
  }

  prompt.addEventListener("input", () => {
    autosize();
    paint();
  });
  prompt.addEventListener("keydown", (event) => {
    if (isPlainEnter(event)) {
      event.preventDefault();
      if (!sendButton.disabled && !sendButton.hidden) form.requestSubmit();
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = prompt.value;
    if (!text.trim() || !canSend()) return;
    prompt.value = "";
    autosize();
    const sent = await send(text);
    // Give the text back to resend, unless the user started typing another.
    if (!sent && !prompt.value) {
      prompt.value = text;
      autosize();
      paint();
    }
  });
  stopButton.addEventListener("click", async () => {
    const stopping = stop();
    if (!stopping) return;
    stopButton.disabled = true;
    try {
      await stopping;
    } finally {
      stopButton.disabled = false;
      prompt.focus();
    }
  });

  return {
    autosize,
    focus: (options) => prompt.focus(options),
    setControls(state) {
      controls = state;
      paint();
    },
  };
}
