// The Speak page: the microphone (or a WAV file) streamed to the gateway's WebSocket door in our
// hotline-asr.v1 dialect (docs/front-doors.md), 16 kHz 16-bit PCM, partials and finals shown live.
(function () {
  "use strict";
  const root = document.getElementById("speak");
  if (!root) return;
  const target = JSON.parse(root.dataset.target);
  const RATE = 16000; // Hz, what the page sends
  const MESSAGE_SAMPLES = RATE / 10; // 100 ms of audio per binary message
  const $ = (id) => document.getElementById(id);
  const startButton = $("speak-start"), stopButton = $("speak-stop"), fileInput = $("speak-file");
  const drop = $("speak-drop"), message = $("speak-message"), state = $("speak-state");
  const finals = $("speak-finals"), partial = $("speak-partial");

  // Band-limited resampling (windowed sinc, Blackman window), streamed: the last HALF input
  // samples are kept between pushes. Input and output are Float32Array in [-1, 1].
  class Resampler {
    constructor(inRate, outRate) {
      this.step = inRate / outRate; // input samples per output sample
      this.cutoff = Math.min(1, outRate / inRate) * 0.92; // of the input's Nyquist frequency
      this.half = Math.ceil(8 / this.cutoff); // taps each side of the centre
      this.buffer = new Float32Array(this.half); // leading zeros: the first outputs see silence before
      this.position = this.half; // input index (in buffer) of the next output sample
    }

    kernel(x) {
      const window = 0.42 + 0.5 * Math.cos((Math.PI * x) / this.half) + 0.08 * Math.cos((2 * Math.PI * x) / this.half);
      const t = Math.PI * this.cutoff * x;
      return (x === 0 ? 1 : Math.sin(t) / t) * window;
    }

    push(input) {
      const buffer = new Float32Array(this.buffer.length + input.length);
      buffer.set(this.buffer);
      buffer.set(input, this.buffer.length);
      const out = [];
      while (this.position + this.half < buffer.length) {
        const centre = Math.floor(this.position), frac = this.position - centre;
        let sum = 0, weights = 0;
        for (let k = 1 - this.half; k <= this.half; k++) {
          const w = this.kernel(k - frac);
          sum += buffer[centre + k] * w;
          weights += w;
        }
        out.push(sum / weights);
        this.position += this.step;
      }
      const keep = Math.max(0, Math.floor(this.position) - this.half);
      this.buffer = buffer.slice(keep);
      this.position -= keep;
      return Float32Array.from(out);
    }
  }

  function toPcm16(samples) {
    const pcm = new Int16Array(samples.length);
    for (let i = 0; i < samples.length; i++) pcm[i] = Math.round(Math.max(-1, Math.min(1, samples[i])) * 32767);
    return pcm;
  }

  function streamUrl() {
    const base = target.url || `${target.scheme}://${location.hostname}:${target.port}${target.path}`;
    const query = new URLSearchParams({ app: "console-speak" });
    const token = $("speak-token").value.trim();
    if (token) query.set("token", token);
    return base + (base.includes("?") ? "&" : "?") + query.toString();
  }

  function setState(name, text) {
    state.dataset.state = name;
    state.textContent = text;
  }

  function showMessage(text) {
    message.textContent = text;
    message.hidden = !text;
  }

  const CLOSE_REASONS = {
    1003: "the audio was not 16-bit PCM at a rate the gateway takes",
    1008: "the gateway refused the stream (a wrong or missing token, or a bad start)",
    1009: "a message was too large",
    1013: "the gateway has no room for another stream now; try again later",
  };

  // One stream: the socket, what is waiting to be sent, and how the page shows its replies.
  class Stream {
    constructor(url, onEnded) {
      this.url = url;
      this.pending = new Int16Array(0);
      this.ready = false;
      this.ended = false;
      this.onEnded = onEnded;
      this.socket = new WebSocket(url, "hotline-asr.v1");
      this.socket.binaryType = "arraybuffer";
      this.opened = new Promise((resolve, reject) => {
        this.socket.onopen = () => this.socket.send(JSON.stringify({ signal: "start", sample_rate: RATE }));
        this.socket.onmessage = (e) => this.receive(JSON.parse(e.data), resolve);
        this.socket.onclose = (e) => {
          this.closed(e, this.ready);
          reject(new Error("closed"));
        };
      });
    }

    receive(event, resolve) {
      if (event.type === "server_ready") {
        this.ready = true;
        setState("listening", `listening (call ${event.call_id})`);
        resolve();
      } else if (event.event_type === "transcript.partial") {
        partial.textContent = event.text;
        partial.hidden = !event.text;
      } else if (event.event_type === "transcript.final") {
        partial.hidden = true;
        if (event.text) finals.append(Object.assign(document.createElement("li"), { className: "final", textContent: event.text }));
      } else if (event.event_type === "call.ended") {
        this.ended = true;
      }
    }

    closed(e, wasReady) {
      if (!wasReady) {
        showMessage(`Could not stream to the gateway's WebSocket door at ${this.url.split("?")[0]}` +
          (e.code === 1006 ? ": no answer. Is the gateway running with websocket.enabled, and can this browser reach that address?"
            : `: ${CLOSE_REASONS[e.code] || `closed with code ${e.code}`}${e.reason ? ` (${e.reason})` : ""}.`));
      } else if (e.code !== 1000) {
        showMessage(`The gateway closed the stream: ${CLOSE_REASONS[e.code] || `code ${e.code}`}${e.reason ? ` (${e.reason})` : ""}.`);
      }
      partial.hidden = true;
      setState("ended", this.ended ? "ended" : "closed");
      this.onEnded();
    }

    send(pcm, flush) {
      const joined = new Int16Array(this.pending.length + pcm.length);
      joined.set(this.pending);
      joined.set(pcm, this.pending.length);
      let from = 0;
      while (joined.length - from >= MESSAGE_SAMPLES || (flush && from < joined.length)) {
        const to = Math.min(joined.length, from + MESSAGE_SAMPLES);
        if (this.socket.readyState === WebSocket.OPEN) this.socket.send(joined.slice(from, to).buffer);
        from = to;
      }
      this.pending = joined.slice(from);
    }

    end() {
      this.send(new Int16Array(0), true);
      if (this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify({ signal: "end" }));
    }
  }

  let stop = null; // what the Stop button does while something streams

  function idle() {
    stop = null;
    startButton.disabled = fileInput.disabled = false;
    stopButton.disabled = true;
  }

  function begin() {
    showMessage("");
    finals.replaceChildren();
    partial.hidden = true;
    startButton.disabled = fileInput.disabled = true;
    setState("connecting", "connecting…");
    $("speak-url").textContent = streamUrl().split("?")[0];
    return new Stream(streamUrl(), idle);
  }

  function insecure() {
    if (location.protocol === "https:" && !(target.url || target.scheme + ":").startsWith("wss:")) {
      return "This page is served over HTTPS, so the browser refuses a plain ws:// stream: serve the door " +
        "as wss:// (websocket.tls on the gateway) or set speak_url in console.yaml to a wss:// address.";
    }
    return "";
  }

  async function startMicrophone() {
    if (insecure()) return showMessage(insecure());
    if (!navigator.mediaDevices || !window.AudioWorkletNode) {
      return showMessage("This browser gives the microphone only to pages served over HTTPS or from localhost: " +
        "set tls_certfile and tls_keyfile in console.yaml, or drop a WAV file instead.");
    }
    let media;
    try {
      media = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
      });
    } catch (err) {
      return showMessage(`No microphone: ${err.message || err.name}. Allow this page to use it, or drop a WAV file.`);
    }
    const context = new AudioContext();
    const stream = begin();
    const release = () => {
      media.getTracks().forEach((t) => t.stop());
      if (context.state !== "closed") context.close();
    };
    try {
      await context.audioWorklet.addModule("/static/speak-worklet.js");
      await stream.opened;
    } catch (err) {
      release();
      stream.socket.close();
      return;
    }
    const resampler = new Resampler(context.sampleRate, RATE);
    const capture = new AudioWorkletNode(context, "hotline-capture");
    const mute = new GainNode(context, { gain: 0 }); // keeps the graph pulled without playing it back
    capture.port.onmessage = (e) => stream.send(toPcm16(resampler.push(e.data)), false);
    context.createMediaStreamSource(media).connect(capture).connect(mute).connect(context.destination);
    stopButton.disabled = false;
    stop = () => {
      release();
      stream.end();
      setState("finishing", "finishing…");
      stopButton.disabled = true;
    };
  }

  async function sendFile(file) {
    if (insecure()) return showMessage(insecure());
    let samples;
    try {
      const context = new AudioContext();
      const decoded = await context.decodeAudioData(await file.arrayBuffer());
      context.close();
      const mono = new Float32Array(decoded.length);
      for (let c = 0; c < decoded.numberOfChannels; c++) {
        const channel = decoded.getChannelData(c);
        for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / decoded.numberOfChannels;
      }
      samples = toPcm16(new Resampler(decoded.sampleRate, RATE).push(mono));
    } catch (err) {
      return showMessage(`Could not read ${file.name} as audio: ${err.message || err.name}.`);
    }
    const stream = begin();
    try {
      await stream.opened;
    } catch (err) {
      return;
    }
    let at = 0, stopped = false;
    stopButton.disabled = false;
    stop = () => { stopped = true; };
    const tick = () => { // real time: the partials come as they would while someone speaks
      if (stopped || at >= samples.length) {
        stream.end();
        setState("finishing", "finishing…");
        stopButton.disabled = true;
        return;
      }
      stream.send(samples.subarray(at, at + MESSAGE_SAMPLES), false);
      at += MESSAGE_SAMPLES;
      setTimeout(tick, (MESSAGE_SAMPLES / RATE) * 1000);
    };
    tick();
  }

  startButton.addEventListener("click", startMicrophone);
  stopButton.addEventListener("click", () => stop && stop());
  fileInput.addEventListener("change", () => fileInput.files[0] && sendFile(fileInput.files[0]));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files[0] && !startButton.disabled) sendFile(e.dataTransfer.files[0]);
  });
})();
