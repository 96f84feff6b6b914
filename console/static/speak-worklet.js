// AudioWorklet of the Speak page: hands the microphone's first channel to the page in blocks of
// BLOCK samples (at the AudioContext's rate), so the page is messaged every ~20 ms, not every
// 128-sample render quantum.
const BLOCK = 1024;

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(BLOCK);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    let from = 0;
    while (from < channel.length) {
      const take = Math.min(channel.length - from, BLOCK - this.filled);
      this.block.set(channel.subarray(from, from + take), this.filled);
      this.filled += take;
      from += take;
      if (this.filled === BLOCK) {
        this.port.postMessage(this.block);
        this.block = new Float32Array(BLOCK);
        this.filled = 0;
      }
    }
    return true;
  }
}

registerProcessor("hotline-capture", CaptureProcessor);
