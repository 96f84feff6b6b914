// hotline-asr console API client (plain JS, no dependencies). Copy it into your own dashboard.
//
//   const api = new HotlineConsole("");            // base URL of the console ("" = same origin)
//   const calls = await api.calls();               // [{call_id, started_at, route, participants, last_text, ...}]
//   const snap = await api.snapshot(callId);       // {call, events: [{stream_id, ...event}]}
//   const es = api.follow(callId, (event, id) => console.log(id, event.event_type, event.text));
//   api.watchCalls((calls) => render(calls));      // the visible calls, again on every change
//
// follow() uses EventSource: it reconnects by itself and sends the last stream id seen as
// Last-Event-ID, so the console resends exactly what was missed. Partials have no id.
// Writes (admin API) need the CSRF token: api.post(path, body) takes it from /api/me.
(function (root) {
  "use strict";

  class HotlineConsole {
    constructor(base) {
      this.base = base || "";
      this.csrf = null;
    }

    async get(path) {
      const response = await fetch(this.base + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) throw Object.assign(new Error(body.error || response.statusText), { status: response.status, body });
      return body;
    }

    async post(path, data) {
      if (this.csrf === null) this.csrf = (await this.get("/api/me")).csrf;
      const response = await fetch(this.base + path, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": this.csrf },
        body: JSON.stringify(data),
      });
      const body = await response.json().catch(() => ({}));
      if (!response.ok && response.status !== 422) {
        throw Object.assign(new Error(body.error || response.statusText), { status: response.status, body });
      }
      return body;
    }

    async calls() {
      return (await this.get("/api/calls")).calls;
    }

    snapshot(callId) {
      return this.get("/api/calls/" + encodeURIComponent(callId));
    }

    // Where the call's confirmed work orders stand with the ticket system, by the
    // workorder.confirmed event id: {deliveries: {event_id: {stage, tries, retry_at, error, ...}}}.
    deliveries(callId) {
      return this.get("/api/calls/" + encodeURIComponent(callId) + "/workorder");
    }

    follow(callId, onEvent, onState) {
      const source = new EventSource(this.base + "/api/calls/" + encodeURIComponent(callId) + "/events", { withCredentials: true });
      source.onmessage = (message) => onEvent(JSON.parse(message.data), message.lastEventId);
      if (onState) {
        source.onopen = () => onState("live");
        source.onerror = () => onState(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
      }
      return source;
    }

    watchCalls(onCalls, onState) {
      const source = new EventSource(this.base + "/api/calls/stream", { withCredentials: true });
      source.addEventListener("calls", (message) => onCalls(JSON.parse(message.data).calls));
      if (onState) {
        source.onopen = () => onState("live");
        source.onerror = () => onState("reconnecting");
      }
      return source;
    }
  }

  root.HotlineConsole = HotlineConsole;
})(typeof window !== "undefined" ? window : globalThis);
