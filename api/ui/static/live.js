// Live updates, the one mechanism every page uses: poll a /ui/api JSON route with If-None-Match. An
// unchanged answer is a 304 and nothing happens; a changed one goes to the page's onData, which updates
// what is on screen in place (never re-rendering a chart's zoom, a filter or the scroll position).
//
//   const poller = Live.poll(url, (data) => { ... }, { intervalMs: 2000 });
//   poller.setUrl(newUrl);   // e.g. another x-axis: the next poll fetches it (no ETag carried over)
//   poller.refresh();        // poll now
//   poller.stop();
"use strict";

const Live = (() => {
  function poll(url, onData, options = {}) {
    const intervalMs = options.intervalMs || 2000;
    const hiddenMs = options.hiddenMs || 15000; // a hidden tab polls rarely
    let etag = null;
    let timer = null;
    let stopped = false;
    let inFlight = false;

    async function tick() {
      if (stopped || inFlight) return;
      inFlight = true;
      const requested = url;
      try {
        const headers = etag ? { "If-None-Match": etag } : {};
        const response = await fetch(requested, { credentials: "same-origin", headers });
        if (response.status === 401) {
          // The session ended (signed out elsewhere, key revoked or expired): to the sign-in page.
          window.location.href = "/ui/login?next=" + encodeURIComponent(location.pathname + location.search);
          return;
        }
        if (response.status === 200 && requested === url) {
          etag = response.headers.get("ETag");
          onData(await response.json());
        } else if (response.status >= 400 && options.onError) {
          options.onError(response.status, await response.text());
        }
      } catch (error) {
        if (options.onError) options.onError(0, String(error));
      } finally {
        inFlight = false;
        schedule(requested !== url); // the URL changed meanwhile: fetch the new one now
      }
    }

    function schedule(now) {
      if (stopped) return;
      clearTimeout(timer);
      timer = setTimeout(tick, now ? 0 : document.hidden ? hiddenMs : intervalMs);
    }

    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) refresh();
    });

    function refresh() {
      clearTimeout(timer);
      tick();
    }

    tick();
    return {
      setUrl(newUrl) {
        if (newUrl !== url) {
          url = newUrl;
          etag = null;
          refresh();
        }
      },
      refresh,
      stop() {
        stopped = true;
        clearTimeout(timer);
      },
    };
  }

  return { poll };
})();
