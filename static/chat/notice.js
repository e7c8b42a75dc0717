// The notice above the composer (errors the user should read) and the connection status
// in the header.

export function createNotice({ box, text, close }) {
  const hide = () => {
    box.hidden = true;
    text.textContent = "";
  };
  close.addEventListener("click", hide);
  return {
    show(message) {
      text.textContent = message;
      box.hidden = false;
    },
    hide,
  };
}

const STATUS_TEXT = { live: "", reconnecting: "Reconnecting…", offline: "Offline", closed: "Disconnected" };

export function createConnectionStatus(element) {
  return (status) => {
    element.textContent = STATUS_TEXT[status] ?? "";
    element.dataset.state = status;
  };
}
