// The console's pages: calls list, call view, admin. Plain JS on top of client.js.
(function () {
  "use strict";
  const api = new HotlineConsole("");
  const meta = document.querySelector('meta[name="csrf-token"]');
  if (meta) api.csrf = meta.content;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  // Make `parent`'s children look like `fresh` (nodes built anew, each with a `keyAttr`
  // attribute) while keeping every existing node whose key is still there. Live lists redraw
  // several times a second; replacing their rows would drop a click whose mouse-down landed
  // on a row that is gone by the mouse-up, and the keyboard focus and any text selected in it.
  function reconcile(parent, fresh, keyAttr) {
    const wanted = new Set(fresh.map((n) => n.getAttribute(keyAttr)));
    const kept = new Map();
    for (const child of [...parent.children]) {
      const key = child.getAttribute(keyAttr);
      if (key === null || !wanted.has(key) || kept.has(key)) child.remove();
      else kept.set(key, child);
    }
    fresh.forEach((node, i) => {
      const old = kept.get(node.getAttribute(keyAttr));
      const row = old ? patch(old, node) : node;
      if (old && row !== old) old.remove(); // not the same kind of node: the fresh one takes its place
      if (parent.children[i] !== row) parent.insertBefore(row, parent.children[i] || null);
    });
  }

  // Bring `old` to what `fresh` shows, touching only what differs; returns the node to keep
  // (`fresh` itself where the two are not the same kind of node). Attributes and text only:
  // handlers set as properties stay those of `old`, so rows given to reconcile() have none.
  function patch(old, fresh) {
    if (old.nodeType !== fresh.nodeType || old.nodeName !== fresh.nodeName) return fresh;
    if (old.nodeType !== Node.ELEMENT_NODE) {
      if (old.nodeValue !== fresh.nodeValue) old.nodeValue = fresh.nodeValue;
      return old;
    }
    for (const { name } of [...old.attributes]) if (!fresh.hasAttribute(name)) old.removeAttribute(name);
    for (const { name, value } of fresh.attributes) if (old.getAttribute(name) !== value) old.setAttribute(name, value);
    patchChildren(old, [...fresh.childNodes]);
    return old;
  }

  function patchChildren(parent, after) {
    const before = [...parent.childNodes];
    if (before.length !== after.length) {
      parent.replaceChildren(...after);
      return;
    }
    before.forEach((child, i) => {
      const next = patch(child, after[i]);
      if (next !== child) parent.replaceChild(next, child);
    });
  }

  function time(ts) {
    return ts ? new Date(ts).toLocaleTimeString() : "";
  }

  // -- event fields in words (docs/events.md) -----------------------------------------
  const END_REASONS = {
    bye: "hung up",
    cancel: "cancelled before it was answered",
    error: "a signalling error",
    "rtp-timeout": "no audio arrived for too long",
    "rtcp-bye": "the media stream said goodbye (RTCP BYE)",
    shutdown: "the gateway shut down",
    node_restart: "the gateway restarted during the call",
    "no-acceptable-answer": "no acceptable media offer",
    "session-refresh-failed": "the session refresh failed",
    "ack-timeout": "the call was never confirmed (no ACK)",
    "session-expired": "the session timer expired",
  };
  const MATCH_KINDS = { keyword: "keyword", all_of: "all keywords", pattern: "pattern" };
  const ENTITY_LABELS = { phone: "phone", id_number: "ID number", address: "address", date: "date", time: "time" };
  const STAT_NAMES = { audio_ms: "audio", duration_ms: "duration", dtmf_events: "key presses" };

  function words(name) {
    return String(name).replace(/[-_]+/g, " ");
  }

  function endReason(reason) {
    return reason ? END_REASONS[reason] || words(reason) : "ended";
  }

  function count(n, noun) {
    return `${n} ${noun}${n === 1 ? "" : "s"}`;
  }

  function seconds(ms) {
    return `${(ms / 1000).toFixed(1)} s`;
  }

  // One stats value: milliseconds as seconds; a per-leg object as its values, one per leg.
  function statValue(key, value) {
    if (value !== null && typeof value === "object") {
      const parts = Object.values(value).map((v) => statValue(key, v));
      return parts.length > 1 ? `${parts.join(" + ")} (${parts.length} legs)` : parts.join("");
    }
    return typeof value === "number" && key.endsWith("_ms") ? seconds(value) : String(value);
  }

  function statsText(stats) {
    return Object.entries(stats || {}).map(([key, value]) => `${STAT_NAMES[key] || words(key)}: ${statValue(key, value)}`).join(" · ");
  }

  function tagText(tag) {
    return tag.kind === "entity" ? `${ENTITY_LABELS[tag.label] || words(tag.label)}: ${tag.value}` : tag.label;
  }

  // A party's pace: the engine's chunk size in force (chunk_ms), against the size it runs at
  // while the node keeps up. Longer chunks mean the live text updates less often.
  function paceText(chunkMs, ownMs) {
    return chunkMs > ownMs
      ? `Slowed down to save capacity: live text updates every ${chunkMs} ms (normally every ${ownMs} ms)`
      : `Live text updates every ${chunkMs} ms`;
  }

  const REDUCED_WORDS = "quick recognition: the service was busy";
  const REDUCED_TITLE = "The service was busy, so this line was recognised with a quicker, narrower search. It may be a little less accurate.";
  // docs/events.md reduced_reason: why the service was busy, for whoever sizes the nodes
  const REDUCED_WHY = {
    finals_queued: "Recognised lines were queuing for their final search.",
    engine_saturated: "Every call on the service was already at its slowest pace.",
  };

  for (const form of document.querySelectorAll("form[data-csrf-form]")) {
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      await fetch(form.action, { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": api.csrf } });
      location.href = "/login";
    });
  }

  // -- calls list --------------------------------------------------------------------
  // Supervisors: how many live calls the service has slowed down to keep up (their latest
  // chunk size above their own), and how many of their lines were recognised the quick way.
  function loadText(calls) {
    const live = calls.filter((c) => c.active);
    if (!live.length) return "No live calls.";
    const slowed = live.filter((c) => c.slowed);
    const reduced = live.reduce((n, c) => n + (c.reduced_finals || 0), 0);
    const slowest = Math.max(0, ...slowed.flatMap((c) => c.pace.map((p) => p.chunk_ms)));
    return (slowed.length
      ? `${slowed.length} of ${count(live.length, "live call")} slowed down to save capacity (live text every ${slowest} ms at most)`
      : `${count(live.length, "live call")}, none slowed down`) + (reduced ? ` · ${count(reduced, "line")} recognised quickly while busy` : "");
  }

  // A gateway's own count (its heartbeat): streams at longer chunks than their route's.
  function slowedStreams(node) {
    if (typeof node.degraded_streams !== "number") return ""; // a gateway that does not report it
    return node.degraded_streams ? `${node.degraded_streams} of ${count(node.engine_streams, "stream")}` : "none";
  }

  function nodeLoadText(node) {
    if (node.stale) return `${node.node}: no report for a while`;
    const slowed = slowedStreams(node);
    const pace = slowed === "" ? "" : slowed === "none" ? " · running at normal speed"
      : ` · ${slowed} slowed down to save capacity`;
    return `${node.node}: ${count(node.active_calls, "call")}${pace}`;
  }

  function callsPage(table) {
    const body = table.querySelector("tbody");
    const empty = document.getElementById("calls-empty");
    const load = document.getElementById("calls-load");
    const nodeList = document.getElementById("calls-nodes");
    if (nodeList) {
      const nodes = async () => {
        const answer = await api.get("/api/admin/nodes");
        reconcile(nodeList, answer.nodes.map((n) => el("li", { "data-node": n.node }, nodeLoadText(n))), "data-node");
      };
      nodes();
      setInterval(nodes, 2000);
    }
    api.watchCalls((calls) => {
      empty.hidden = calls.length > 0;
      if (load) load.textContent = loadText(calls);
      reconcile(body, calls.map((call) => {
        const who = (call.participants || []).map((p) => `${p.role}: ${p.name || p.aor || "?"}`).join(", ");
        const last = call.last_text ? `${call.last_text.role || ""} ${call.last_text.text}` : "";
        return el("tr", { class: call.active ? "active" : "ended", "data-call-id": call.call_id },
          el("td", {}, el("a", { href: "/calls/" + encodeURIComponent(call.call_id) }, time(call.started_at) || call.call_id)),
          el("td", {}, call.route || "default profile"), el("td", {}, who), el("td", {}, call.agent_id || ""),
          el("td", { class: call.last_text && call.last_text.is_partial ? "partial" : "" }, last),
          el("td", {}, (call.suggestions || []).join("、")),
          el("td", { class: call.active && call.slowed ? "slowed" : "" },
            call.active ? (call.slowed ? "live · slowed down to save capacity" : "live") : `ended: ${endReason(call.end_reason)}`));
      }), "data-call-id");
    });
  }

  // -- the supervisors' summary of call.analytics -----------------------------------
  function analyticsPage() {
    const body = document.querySelector("#analytics-calls tbody");
    const percent = (part, whole) => (whole ? `${Math.round((100 * part) / whole)} %` : "-");
    api.watchCalls((calls) => {
      const analysed = calls.filter((c) => c.analytics);
      const checks = new Map(); // id -> [passed, decided]
      const categories = new Map();
      let duration = 0, silence = 0, overlaps = 0;
      const rows = [];
      for (const call of analysed) {
        const a = call.analytics;
        duration += a.duration_ms;
        silence += a.non_talk_ms;
        overlaps += a.overlaps;
        for (const id of a.passed) { const c = checks.get(id) || [0, 0]; c[0] += 1; c[1] += 1; checks.set(id, c); }
        for (const id of a.failed) { const c = checks.get(id) || [0, 0]; c[1] += 1; checks.set(id, c); }
        for (const label of a.categories) categories.set(label, (categories.get(label) || 0) + 1);
        const talk = Object.entries(a.talk_ms).map(([role, ms]) => `${role} ${seconds(ms)}`).join(" · ");
        rows.push(el("tr", { "data-call-id": call.call_id },
          el("td", {}, el("a", { href: "/calls/" + encodeURIComponent(call.call_id) }, time(call.started_at) || call.call_id)),
          el("td", {}, call.agent_id || ""), el("td", {}, seconds(a.duration_ms)), el("td", {}, talk),
          el("td", {}, seconds(a.non_talk_ms)), el("td", {}, `${a.overlaps} (${seconds(a.overlap_ms)})`),
          el("td", { class: a.failed.length ? "failed" : "" }, a.failed.map(words).join(", ") || "none"),
          el("td", {}, a.categories.join("、"))));
      }
      reconcile(body, rows, "data-call-id");
      document.getElementById("analytics-overview").textContent = analysed.length
        ? `${analysed.length} calls · ${seconds(duration)} of audio · silence ${percent(silence, duration)} · ${overlaps} overlaps`
        : "No analysed calls yet.";
      document.getElementById("analytics-rates").replaceChildren(
        ...[...checks].map(([id, [passed, decided]]) => el("li", {}, `${words(id)}: passed ${passed} of ${decided} (${percent(passed, decided)})`)),
        ...[...categories].map(([label, count]) => el("li", {}, `${label}: ${count} calls`)));
    });
  }

  // -- one call ----------------------------------------------------------------------
  function callPage(root) {
    const callId = root.dataset.callId;
    const utterances = new Map(); // key -> {node, final, text, spans}
    const cards = new Map();
    const tagsSeen = new Set();
    const state = document.getElementById("call-state");

    function laneOf(participant) {
      const role = participant && participant.role === "agent" ? "agent" : "caller";
      return document.querySelector(`#lane-${role} .utts`);
    }

    function keyOf(event) {
      const p = event.participant || {};
      return [p.role, p.aor, p.label, event.utterance_id].join("|");
    }

    function render(u) {
      const spans = u.spans.filter((s) => s.final === u.final).sort((a, b) => a.begin - b.begin);
      const parts = [];
      let at = 0;
      for (const s of spans) {
        if (s.begin < at || s.end > u.text.length) continue;
        parts.push(u.text.slice(at, s.begin), el("mark", {}, u.text.slice(s.begin, s.end)));
        at = s.end;
      }
      parts.push(u.text.slice(at));
      if (u.reduced) {
        const title = REDUCED_WHY[u.reducedReason] ? `${REDUCED_TITLE} ${REDUCED_WHY[u.reducedReason]}` : REDUCED_TITLE;
        parts.push(el("span", { class: "badge reduced", title, "data-reason": u.reducedReason || "" }, REDUCED_WORDS));
      }
      u.node.replaceChildren(...parts);
      u.node.className = "utt " + (u.final ? "final" : "partial");
    }

    function utterance(event) {
      const key = keyOf(event);
      let u = utterances.get(key);
      if (!u) {
        u = { node: el("p", { class: "utt partial", "data-key": key }), final: false, reduced: false, reducedReason: "", text: "", spans: [] };
        utterances.set(key, u);
        laneOf(event.participant).append(u.node);
      }
      return u;
    }

    // -- each party's pace, above its lane (docs/events.md chunk_ms)
    const routeChunkMs = Number(root.dataset.routeChunkMs) || 0; // 0: the route's size is unknown
    const paces = new Map(); // party key -> {node, least}

    function pace(event) {
      if (!(event.chunk_ms > 0)) return;
      const p = event.participant || {};
      const key = [p.role, p.aor, p.label].join("|");
      let entry = paces.get(key);
      if (!entry) {
        entry = { node: el("p", { class: "pace", "data-party": key, title: p.name || p.aor || "" }), least: event.chunk_ms, seq: 0 };
        paces.set(key, entry);
        laneOf(p).parentNode.querySelector(".paces").append(entry.node);
      }
      entry.least = Math.min(entry.least, event.chunk_ms);
      if ((event.seq || 0) < entry.seq) return; // a partial that came after later results
      entry.seq = event.seq || 0;
      const own = routeChunkMs || entry.least;
      entry.node.className = "pace" + (event.chunk_ms > own ? " slowed" : "");
      entry.node.setAttribute("data-chunk-ms", String(event.chunk_ms));
      entry.node.textContent = paceText(event.chunk_ms, own);
    }

    function transcript(event) {
      const u = utterance(event);
      if (u.final) return; // a late partial after its final
      u.text = event.text || "";
      u.final = !event.is_partial;
      u.reduced = u.final && event.reduced_search === true;
      u.reducedReason = u.reduced ? event.reduced_reason || "" : "";
      pace(event);
      if (u.final) {
        u.node.setAttribute("data-final-at", String(Date.now()));
        u.node.setAttribute("data-event-ts", event.ts || "");
      }
      render(u);
    }

    function suggestion(event) {
      let card = cards.get(event.entry_id);
      if (!card) {
        card = el("div", { class: "card", "data-entry-id": event.entry_id, "data-shown-at": String(Date.now()) });
        cards.set(event.entry_id, card);
        document.getElementById("cards").prepend(card);
      }
      card.className = "card " + event.status;
      if (event.status === "confirmed" && !card.hasAttribute("data-confirmed-at")) {
        card.setAttribute("data-confirmed-at", String(Date.now()));
      }
      const parts = [
        el("div", { class: "title" }, event.title, el("span", { class: "badge" }, event.status)),
        event.summary ? el("div", {}, event.summary) : null,
        el("div", { class: "meta" }, `match ${Math.round(event.score * 100)} % · ${MATCH_KINDS[event.match_kind] || words(event.match_kind)}${event.homophone ? " · sounds alike" : ""} · heard “${event.matched_text}”`),
        event.url ? el("a", { href: event.url, target: "_blank", rel: "noopener" }, event.url) : null];
      patchChildren(card, parts.filter((p) => p !== null)); // its link stays put for a click under way
      if (event.span && event.status !== "withdrawn") {
        const u = utterance(event);
        u.spans.push({ begin: event.span.begin, end: event.span.end, final: !event.is_partial });
        render(u);
      }
    }

    function tags(event) {
      for (const tag of event.tags || []) {
        const key = [tag.kind, tag.label, tag.value].join("|");
        if (tagsSeen.has(key)) continue;
        tagsSeen.add(key);
        document.getElementById("chips").append(el("span", { class: "chip " + tag.kind, title: tag.kind }, tagText(tag)));
      }
    }

    function started(event) {
      const who = (event.participants || []).map((p) => `${p.role} ${p.name || p.aor || ""}`).join(" · ");
      const agent = (event.metadata || {})[root.dataset.agentKey];
      document.getElementById("call-info").textContent =
        `started ${time(event.ts)} · ${event.route ? "route " + event.route : "default profile"} · ${who}${agent ? " · agent " + agent : ""}`;
    }

    // -- the work-order draft (docs/workorder.md) and its confirmation
    const form = document.getElementById("workorder");
    const confirmButton = document.getElementById("workorder-confirm");
    const formState = document.getElementById("workorder-state");
    const SHOWN_NORMALIZED = new Set(["address", "time"]); // as console/workorders.py form_value
    let callEnded = false;

    function formValue(name, field) {
      if (!field) return "";
      return (SHOWN_NORMALIZED.has(name) && field.normalized) || field.value;
    }

    function drafted(event) {
      form.hidden = false;
      document.getElementById("workorder-revision").textContent = "draft " + event.revision;
      for (const [name, field] of Object.entries(event.fields || {})) {
        const input = form.elements.namedItem(name);
        if (!input || input.dataset.edited) continue; // never overwrite what the agent typed
        input.value = formValue(name, field);
        input.title = field && field.matched && field.matched.length ? "heard: " + field.matched.join(", ") : "";
      }
    }

    function confirmed(event) {
      form.hidden = false;
      const changed = (event.changes || []).map((c) => c.field).join(", ");
      formState.textContent = `confirmed by ${event.confirmed_by} ${time(event.ts)}` + (changed ? ` · changed: ${changed}` : " · no changes");
      watchDelivery(event.event_id);
    }

    // -- the latest confirmation's way to the ticket system (console/webhooks.py), asked for
    // again while it is on its way: every second while it is first sent, every 2 s while it
    // waits for a retry. Nothing is shown where the route sends no webhook.
    const deliveryState = document.getElementById("workorder-delivery");
    let watchedDelivery = null;

    function deliveryText(d) {
      if (d.stage === "sent") return "sent to the ticket system";
      if (d.stage === "refused") return `the ticket system did not take it: ${d.error}`;
      if (d.stage === "sending") return "sending to the ticket system…";
      const tries = `${d.tries} ${d.tries === 1 ? "try" : "tries"} so far`;
      const at = d.retry_at ? ` at ${new Date(d.retry_at * 1000).toLocaleTimeString()}` : "";
      return `waiting to send, will retry${at} (${tries}; ${d.error})`;
    }

    async function watchDelivery(eventId) {
      watchedDelivery = eventId;
      while (watchedDelivery === eventId) {
        let wait = 2000;
        try {
          const d = (await api.deliveries(callId)).deliveries[eventId];
          if (watchedDelivery !== eventId) return;
          deliveryState.textContent = d ? deliveryText(d) : "";
          deliveryState.dataset.stage = d ? d.stage : "";
          if (!d || d.stage === "sent" || d.stage === "refused") return; // no webhook, or done
          if (d.stage === "sending") wait = 1000;
        } catch (error) {
          deliveryState.textContent = `delivery state unknown (${error.message}); asking again`;
        }
        await new Promise((resolve) => setTimeout(resolve, wait));
      }
    }

    form.addEventListener("input", (e) => { if (e.target.name) e.target.dataset.edited = "1"; });
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const fields = {};
      for (const input of form.querySelectorAll("input, textarea")) fields[input.name] = input.value;
      confirmButton.disabled = true;
      try {
        const answer = await api.post(`/api/calls/${encodeURIComponent(callId)}/workorder`, { fields });
        if (answer.error) formState.textContent = answer.error;
      } catch (error) {
        formState.textContent = error.message;
      } finally {
        confirmButton.disabled = !callEnded;
      }
    });

    function analytics(event) {
      document.getElementById("analytics").hidden = false;
      const talk = Object.entries(event.talk_ms || {}).map(([role, ms]) => `${role} ${seconds(ms)}`).join(" · ");
      const rate = Object.entries(event.speaking_rate || {}).map(([role, r]) => `${role} ${Math.round(r)} chars/min`).join(" · ");
      const overlap = event.overlap || {};
      const who = (overlap.interruptions || []).map((i) => `${i.by} interrupted ${i.of} ${i.count}×`).join(", ");
      const categories = (event.categories || []).map((c) => c.label).join(", ");
      document.getElementById("analytics-text").textContent =
        `talk ${talk || "-"} · silence ${seconds(event.non_talk_ms)} · overlaps ${overlap.count || 0} (${seconds(overlap.total_ms || 0)})` +
        `${who ? ": " + who : ""} · rate ${rate || "-"}${categories ? " · categories: " + categories : ""}`;
      const verdict = (passed) => (passed === true ? "passed" : passed === false ? "failed" : "did not apply");
      document.getElementById("analytics-checks").replaceChildren(...(event.checks || []).map((c) =>
        el("li", { class: "check " + verdict(c.passed).replace(/ /g, "-") }, `${words(c.id)}: ${verdict(c.passed)}${c.phrase ? " (“" + c.phrase + "”)" : ""}`)));
    }

    function ended(event) {
      callEnded = true;
      confirmButton.disabled = false;
      const box = document.getElementById("summary");
      box.hidden = false;
      const stats = statsText(event.stats);
      document.getElementById("summary-text").textContent = `${time(event.ts)} · ${endReason(event.reason)}${stats ? " · " + stats : ""}`;
      state.textContent = "ended";
    }

    const handlers = {
      "call.started": started,
      "transcript.partial": transcript,
      "transcript.final": transcript,
      "kb.suggestion": suggestion,
      tags: tags,
      "call.ended": ended,
      "call.analytics": analytics,
      "workorder.updated": drafted,
      "workorder.confirmed": confirmed,
    };
    api.follow(callId, (event) => {
      const handler = handlers[event.event_type];
      if (handler) handler(event);
    }, (s) => { if (state.textContent !== "ended") state.textContent = s; });
  }

  // -- admin -------------------------------------------------------------------------
  function adminPage() {
    const select = document.getElementById("file-key");
    const editor = document.getElementById("editor");
    const errors = document.getElementById("errors");
    const result = document.getElementById("apply-result");
    let appliedAt = null;

    function showErrors(lines) {
      errors.replaceChildren(...lines.map((line) => el("li", {}, line)));
    }

    async function loadFile() {
      const file = await api.get("/api/admin/files/" + encodeURIComponent(select.value));
      editor.value = file.content;
      document.getElementById("file-path").textContent = file.path;
      showVersions(file.versions);
    }

    function showVersions(versions) {
      const body = document.querySelector("#versions tbody");
      body.replaceChildren(...versions.map((v) => el("tr", { "data-version": String(v.id) },
        el("td", {}, String(v.id)), el("td", {}, new Date(v.at * 1000).toLocaleString()), el("td", {}, v.user),
        el("td", {}, v.comment),
        el("td", {}, el("button", { class: "show-diff", onclick: () => showDiff(v.id) }, "diff"), " ",
          el("button", { class: "rollback", onclick: () => rollback(v.id) }, "roll back")))));
    }

    async function showDiff(id) {
      const version = await api.get("/api/admin/versions/" + id);
      const pre = document.getElementById("diff");
      pre.hidden = false;
      pre.textContent = version.diff || "(no change)";
    }

    async function rollback(id) {
      const answer = await api.post("/api/admin/rollback", { version: id });
      afterApply(answer);
    }

    function afterApply(answer) {
      if (!answer.ok) {
        result.textContent = "not applied";
        showErrors(answer.errors || [answer.error || "failed"]);
        return;
      }
      appliedAt = answer.applied_at;
      showErrors([]);
      result.textContent = `applied as version ${answer.version.id}; reload sent to ${answer.reload_receivers} gateway(s)`;
      result.setAttribute("data-applied-version", String(answer.version.id));
      loadFile();
      audit();
      nodes();
    }

    async function nodes() {
      const answer = await api.get("/api/admin/nodes");
      const body = document.querySelector("#nodes tbody");
      reconcile(body, answer.nodes.map((n) => {
        const reload = n.last_reload || {};
        const took = appliedAt !== null && reload.at >= appliedAt - 0.001 && reload.ok;
        const status = n.stale ? "gone?" : !reload.ok ? "reload failed" : took ? "running the applied version" : "up";
        return el("tr", { "data-node": n.node, "data-version": n.config_version },
          el("td", { class: "mono" }, n.node), el("td", { class: "mono node-version" }, n.config_version),
          el("td", {}, reload.at ? new Date(reload.at * 1000).toLocaleTimeString() : ""),
          el("td", {}, String(n.active_calls)),
          el("td", { class: "node-slowed" + (n.degraded_streams ? " slowed" : "") }, slowedStreams(n)),
          el("td", { class: n.stale || !reload.ok ? "stale" : took ? "ok" : "" }, status + (reload.errors && reload.errors.length ? ": " + reload.errors.join("; ") : "")));
      }), "data-node");
    }

    async function audit() {
      const answer = await api.get("/api/admin/audit");
      document.getElementById("audit").replaceChildren(...answer.audit.map((a) =>
        el("li", {}, `${new Date(a.at * 1000).toLocaleString()} ${a.user} ${a.action} ${a.key || ""}${a.version ? " v" + a.version : ""}${a.to_version ? " → v" + a.to_version : ""}`)));
    }

    document.getElementById("validate").onclick = async () => {
      const answer = await api.post("/api/admin/validate", { key: select.value, content: editor.value });
      result.textContent = answer.ok ? "valid" : "invalid";
      showErrors(answer.errors);
    };
    document.getElementById("apply").onclick = async () => {
      result.textContent = "applying…";
      afterApply(await api.post("/api/admin/apply", { key: select.value, content: editor.value, comment: document.getElementById("comment").value }));
    };
    document.getElementById("try").onclick = async () => {
      const profile = document.getElementById("try-profile").value || null;
      const answer = await api.post("/api/admin/try", { text: document.getElementById("try-text").value, profile, drafts: { [select.value]: editor.value } });
      const out = document.getElementById("try-result");
      if (answer.errors) { out.replaceChildren(el("ul", { class: "errors" }, ...answer.errors.map((e) => el("li", {}, e)))); return; }
      const profiles = document.getElementById("try-profile");
      if (profiles.options.length === 0) {
        for (const name of answer.profiles) profiles.append(el("option", { value: name, selected: name === answer.profile }, name));
      }
      out.replaceChildren(
        el("p", {}, `redacted (${answer.redaction}): `, el("span", { class: "mono try-text" }, answer.text)),
        el("table", { class: "try-suggestions" }, el("tr", {}, el("th", {}, "KB entry"), el("th", {}, "score"), el("th", {}, "kind"), el("th", {}, "homophone"), el("th", {}, "matched")),
          ...answer.suggestions.map((s) => el("tr", { "data-entry-id": s.entry_id }, el("td", {}, s.title), el("td", {}, String(s.score)), el("td", {}, s.match_kind), el("td", {}, s.homophone ? "yes" : "no"), el("td", {}, s.matched_text)))),
        el("p", {}, ...answer.tags.map((t) => el("span", { class: "chip " + t.kind }, tagText(t)))));
    };
    select.onchange = loadFile;

    api.get("/api/admin/files").then((answer) => {
      for (const f of answer.files) select.append(el("option", { value: f.key }, f.key));
      const kb = answer.files.find((f) => f.key.startsWith("kb:"));
      if (kb) select.value = kb.key;
      loadFile();
    });
    nodes();
    audit();
    setInterval(nodes, 1000);
  }

  const page = document.querySelector("[data-page]");
  if (page && page.dataset.page === "calls") callsPage(page);
  if (page && page.dataset.page === "call") callPage(page);
  if (page && page.dataset.page === "admin") adminPage();
  if (page && page.dataset.page === "analytics") analyticsPage();
})();
