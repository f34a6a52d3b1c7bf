// Replays flash-attn-wgpu plans on Dawn (the WebGPU implementation in Chrome, with its Tint
// shader compiler) through the `webgpu` npm package. The Rust side (tests/dawn.rs) exports
// everything as data: WGSL per step, bindings, the Params words, grids,
// buffer contents and the f64 reference's expected outputs. This file only replays and
// compares, so the two implementations cannot drift.
//
//   node runner.mjs info                 adapter, features, limits (JSON on stdout)
//   node runner.mjs compile FILE.json    create a shader module for every source; list errors
//   node runner.mjs run FILE.json        run every case, check it, print one line per case
//   node runner.mjs bench FILE.json N    run every case N times, print GPU (or wall) ms
//   (DAWN_TOGGLES=a,b in the environment enables Dawn toggles)
//
// Exit status: 0 when everything compiled / matched, 1 otherwise, 2 on bad usage.

import { readFileSync, writeSync } from 'node:fs';
import { create, globals } from 'webgpu';

Object.assign(globalThis, globals);

// Output goes out synchronously: console.log to a pipe is asynchronous in Node, and the
// process ends with process.exit below.
const say = (line) => writeSync(1, `${line}\n`);

const WANTED = ['shader-f16', 'subgroups', 'timestamp-query'];

// Kept for the whole run: once the instance is garbage-collected, Dawn tears down under the
// device still in use and the process crashes.
let gpu = null;

async function open() {
  // DAWN_TOGGLES=a,b enables Dawn toggles (for measurements, e.g. disable_robustness).
  const toggles = process.env.DAWN_TOGGLES;
  gpu = create(toggles ? [`enable-dawn-features=${toggles}`] : []);
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error('Dawn found no adapter');
  const requiredFeatures = WANTED.filter((f) => adapter.features.has(f));
  // WebGPU default limits: the library plans for them, as a browser gives them.
  const device = await adapter.requestDevice({ requiredFeatures });
  device.addEventListener('uncapturederror', (e) => {
    console.error(`uncaptured WebGPU error: ${e.error.message}`);
    process.exitCode = 1;
  });
  return { adapter, device, features: requiredFeatures };
}

function adapterInfo(adapter, features) {
  const i = adapter.info;
  return {
    description: i.description,
    vendor: i.vendor,
    architecture: i.architecture,
    subgroup_min_size: i.subgroupMinSize ?? 0,
    subgroup_max_size: i.subgroupMaxSize ?? 0,
    features,
    max_workgroup_storage_bytes: 16384,
    max_invocations_per_workgroup: 256,
  };
}

// ---- element decoding for the checks

function f16ToF32(h) {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

const bf16Buf = new DataView(new ArrayBuffer(4));
function bf16ToF32(h) {
  bf16Buf.setUint32(0, h << 16, true);
  return bf16Buf.getFloat32(0, true);
}

function decode(bytes, dtype, count) {
  const out = new Float64Array(count);
  if (dtype === 'f32') {
    const f = new Float32Array(bytes.buffer, bytes.byteOffset, count);
    for (let i = 0; i < count; i++) out[i] = f[i];
  } else {
    const u = new Uint16Array(bytes.buffer, bytes.byteOffset, count);
    const conv = dtype === 'f16' ? f16ToF32 : bf16ToF32;
    for (let i = 0; i < count; i++) out[i] = conv(u[i]);
  }
  return out;
}

// ---- replay

const modules = new Map();

// A shader module through Tint; its validation error (WGSL Tint rejects) becomes an exception.
async function compileModule(device, code, label) {
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ code, label });
  const err = await device.popErrorScope();
  if (err) throw new Error(`${label}: Tint: ${err.message.split('\n').slice(0, 4).join(' | ')}`);
  return module;
}
const pipelines = new Map();

async function pipelineFor(device, step) {
  const key = step.wgsl;
  if (pipelines.has(key)) return pipelines.get(key);
  let module = modules.get(step.wgsl);
  if (!module) {
    module = await compileModule(device, step.wgsl, step.label);
    modules.set(step.wgsl, module);
  }
  const layout = device.createBindGroupLayout({
    label: step.label,
    entries: [
      { binding: 0, visibility: GPUShaderStage.COMPUTE, buffer: { type: 'uniform' } },
      ...step.bindings.map((b, i) => ({
        binding: i + 1,
        visibility: GPUShaderStage.COMPUTE,
        buffer: { type: b.uniform ? 'uniform' : b.read_only ? 'read-only-storage' : 'storage' },
      })),
    ],
  });
  device.pushErrorScope('validation');
  const pipeline = await device.createComputePipelineAsync({
    label: step.label,
    layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
    compute: { module, entryPoint: 'main' },
  });
  const err = await device.popErrorScope();
  if (err) throw new Error(`${step.label}: pipeline: ${err.message}`);
  const p = { pipeline, layout };
  pipelines.set(key, p);
  return p;
}

// Buffers are created zeroed; inputs are written from their words.
function makeBuffers(device, c) {
  return c.buffers.map((b) => {
    const buf = device.createBuffer({
      label: b.label,
      size: b.bytes,
      usage: (b.uniform ? GPUBufferUsage.UNIFORM : GPUBufferUsage.STORAGE) | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
    });
    if (b.words) device.queue.writeBuffer(buf, 0, new Uint32Array(b.words));
    return buf;
  });
}

// Records every step of a case; with a query set, a begin and end timestamp per pass.
async function record(device, c, buffers, query) {
  const prepared = [];
  for (const step of c.steps) {
    const { pipeline, layout } = await pipelineFor(device, step);
    const params = device.createBuffer({ size: step.params.length * 4, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    device.queue.writeBuffer(params, 0, new Uint32Array(step.params));
    const bindGroup = device.createBindGroup({
      layout,
      entries: [
        { binding: 0, resource: { buffer: params } },
        ...step.bindings.map((b, i) => ({
          binding: i + 1,
          resource: b.offset == null
            ? { buffer: buffers[b.buffer] }
            : { buffer: buffers[b.buffer], offset: b.offset, size: b.size },
        })),
      ],
    });
    prepared.push({ pipeline, bindGroup, grid: step.grid });
  }
  const enc = device.createCommandEncoder();
  prepared.forEach((p, n) => {
    if (p.grid[0] === 0) return;
    const pass = enc.beginComputePass(query ? {
      timestampWrites: { querySet: query, beginningOfPassWriteIndex: 2 * n, endOfPassWriteIndex: 2 * n + 1 },
    } : {});
    pass.setPipeline(p.pipeline);
    pass.setBindGroup(0, p.bindGroup);
    pass.dispatchWorkgroups(p.grid[0], p.grid[1]);
    pass.end();
  });
  return enc;
}

async function readBack(device, buf, bytes) {
  const staging = device.createBuffer({ size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(buf, 0, staging, 0, bytes);
  device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const copy = new Uint8Array(staging.getMappedRange().slice(0));
  staging.unmap();
  staging.destroy();
  return copy;
}

function checkOne(chk, got) {
  const nan = new Set(chk.nan ?? []);
  for (const i of nan) {
    if (!Number.isNaN(got[i])) return { ok: false, detail: `${chk.label}[${i}] = ${got[i]}, want NaN (the row sees a NaN)` };
  }
  if (chk.kind === 'lse') {
    for (let i = 0; i < chk.expected.length; i++) {
      if (nan.has(i)) continue;
      const w = chk.expected[i];
      const g = got[i];
      if (w === null) {
        if (g !== -Infinity) return { ok: false, detail: `lse[${i}] = ${g}, want -inf (row sees no key)` };
      } else if (!(Math.abs(g - w) <= chk.tol * Math.max(1, Math.abs(w)))) {
        return { ok: false, detail: `lse[${i}] = ${g}, want ${w}` };
      }
    }
    return { ok: true, err: 0 };
  }
  let scale = 1e-30;
  chk.expected.forEach((w, i) => { if (!nan.has(i)) scale = Math.max(scale, Math.abs(w)); });
  let worst = 0;
  let at = 0;
  for (let i = 0; i < chk.expected.length; i++) {
    if (nan.has(i)) continue;
    const e = Math.abs(got[i] - chk.expected[i]);
    if (!(e <= worst)) {
      worst = Number.isNaN(e) ? Infinity : e;
      at = i;
    }
  }
  const rel = worst / scale;
  if (!(rel <= chk.tol)) {
    return { ok: false, detail: `${chk.label}[${at}] = ${got[at]}, want ${chk.expected[at]}: error ${rel.toExponential(3)} of max|ref| > ${chk.tol}` };
  }
  return { ok: true, err: rel };
}

async function runCase(device, c) {
  const buffers = makeBuffers(device, c);
  const enc = await record(device, c, buffers, null);
  device.pushErrorScope('validation');
  device.queue.submit([enc.finish()]);
  const err = await device.popErrorScope();
  if (err) return { ok: false, detail: `submit: ${err.message}` };
  const results = [];
  for (const chk of c.checks) {
    const b = c.buffers[chk.buffer];
    const bytes = await readBack(device, buffers[chk.buffer], b.bytes);
    const got = decode(bytes, chk.dtype, chk.expected.length);
    const r = checkOne(chk, got);
    results.push({ label: chk.label, ...r });
    if (!r.ok) break;
  }
  buffers.forEach((b) => b.destroy());
  const bad = results.find((r) => !r.ok);
  return bad ? { ok: false, detail: bad.detail } : { ok: true, errors: Object.fromEntries(results.map((r) => [r.label, r.err])) };
}

async function benchCase(device, c, repeats, timestamps) {
  const buffers = makeBuffers(device, c);
  const times = [];
  for (let rep = 0; rep <= repeats; rep++) {
    const n = 2 * c.steps.length;
    const query = timestamps ? device.createQuerySet({ type: 'timestamp', count: n }) : null;
    const enc = await record(device, c, buffers, query);
    let resolve = null;
    if (query) {
      resolve = device.createBuffer({ size: n * 8, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
      enc.resolveQuerySet(query, 0, n, resolve, 0);
    }
    const t0 = performance.now();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    let ms = performance.now() - t0;
    if (query) {
      const ts = new BigUint64Array((await readBack(device, resolve, n * 8)).buffer);
      let first = ts[0];
      let last = ts[1];
      for (let i = 0; i < n; i += 2) {
        if (ts[i] < first) first = ts[i];
        if (ts[i + 1] > last) last = ts[i + 1];
      }
      if (last > first) ms = Number(last - first) / 1e6;
      resolve.destroy();
      query.destroy();
    }
    if (rep > 0) times.push(ms);
  }
  buffers.forEach((b) => b.destroy());
  times.sort((a, b) => a - b);
  return times[times.length >> 1];
}

async function main() {
  const [cmd, file, arg] = process.argv.slice(2);
  if (cmd !== 'info' && !file) {
    console.error('usage: node runner.mjs info | compile FILE | run FILE | bench FILE REPEATS');
    return 2;
  }
  const data = cmd === 'info' ? null : JSON.parse(readFileSync(file, 'utf8'));
  const { adapter, device, features } = await open();
  if (cmd === 'info') {
    say(JSON.stringify(adapterInfo(adapter, features)));
    return 0;
  }
  if (cmd === 'compile') {
    let failed = 0;
    for (const m of data.modules) {
      const err = await compileModule(device, m.wgsl, m.label).then(() => null, (e) => e);
      if (err) {
        failed++;
        say(`FAIL ${err.message}`);
      }
    }
    say(`compiled ${data.modules.length} modules with Tint: ${data.modules.length - failed} ok, ${failed} failed`);
    return failed ? 1 : 0;
  }
  if (cmd === 'run') {
    let failed = 0;
    for (const c of data.cases) {
      let r;
      try {
        r = await runCase(device, c);
      } catch (e) {
        r = { ok: false, detail: e.message };
      }
      if (!r.ok) failed++;
      say(`${r.ok ? 'ok  ' : 'FAIL'} ${c.name}${r.ok ? ' ' + JSON.stringify(r.errors) : ': ' + r.detail}`);
    }
    say(`${data.cases.length - failed} passed, ${failed} failed`);
    return failed ? 1 : 0;
  }
  if (cmd === 'bench') {
    const repeats = Number(arg ?? 3);
    const timestamps = features.includes('timestamp-query');
    for (const c of data.cases) {
      const ms = await benchCase(device, c, repeats, timestamps);
      say(JSON.stringify({ name: c.name, ms, from_timestamps: timestamps }));
    }
    return 0;
  }
  console.error(`unknown command ${cmd}`);
  return 2;
}

main().then(
  (code) => process.exit(process.exitCode || code),
  (e) => {
    console.error(e.stack ?? String(e));
    process.exit(1);
  },
);
