// The message list follows a streaming reply while the reader is at the bottom, and stays
// put once they scroll up (with a "Jump to latest" button to come back).
const NEAR_BOTTOM_PX = 24;

const reducedMotion = () => window.matchMedia("(prefers-reduced-motion: reduce)").matches;

export function createScroll({ scroller, content, jump, onJump }) {
  let stick = true;
  let lastTop = 0;
  const distanceFromBottom = () => scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight;

  scroller.addEventListener("scroll", () => {
    const top = scroller.scrollTop;
    const distance = distanceFromBottom();
    // Only a move up unsticks: content growing under the reader must not.
    if (distance <= NEAR_BOTTOM_PX) stick = true;
    else if (top < lastTop) stick = false;
    lastTop = top;
    jump.hidden = stick || distance <= NEAR_BOTTOM_PX;
  }, { passive: true });

  function follow() {
    if (stick) {
      scroller.scrollTop = scroller.scrollHeight;
      lastTop = scroller.scrollTop;
    } else {
      jump.hidden = distanceFromBottom() <= NEAR_BOTTOM_PX;
    }
  }

  function toEnd(smooth = false) {
    stick = true;
    scroller.scrollTo({ top: scroller.scrollHeight, behavior: smooth && !reducedMotion() ? "smooth" : "auto" });
    lastTop = scroller.scrollTop;
    jump.hidden = true;
  }

  jump.addEventListener("click", () => {
    toEnd(true);
    onJump();
  });
  new ResizeObserver(() => follow()).observe(content);

  return {
    follow,
    toEnd,
    // A newly opened conversation starts at its end.
    reset() {
      stick = true;
    },
    get stuck() {
      return stick;
    },
  };
}
