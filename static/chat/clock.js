// The timers the stream and reply logic use; tests pass a fake one to control time.
export const systemClock = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (id) => clearTimeout(id),
  now: () => performance.now(),
};
