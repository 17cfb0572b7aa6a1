// One step of a scripted client run, bounded in time: shared by the Node interop clients (lib.mjs) and the browser
// page (tests/browser/page.mjs, bundled by esbuild), so it imports nothing of Node's.

/** `fn()`'s result, or a rejection `step timed out after <timeoutMs> ms` if it takes longer. */
export async function withDeadline(fn, timeoutMs) {
  let timer;
  try {
    return await Promise.race([
      fn(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`step timed out after ${timeoutMs} ms`)), timeoutMs);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
