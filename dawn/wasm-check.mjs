// Runs the crate compiled to wasm32 (examples/web, built by scripts/web-check.sh with
// wasm-bindgen's nodejs target) on Dawn under Node.js: Dawn's `webgpu` package provides
// navigator.gpu, as a browser would, and the check compares forward and backward with the f64
// reference inside the wasm module. Usage: node wasm-check.mjs <wasm-bindgen output dir> [seed]
import { createRequire } from 'node:module';
import { create, globals } from 'webgpu';

Object.assign(globalThis, globals);
// wgpu's WebGPU backend finds the GPU as a page does: a global `Window` says it runs in a
// window, and navigator.gpu is the entry point (Node.js 20 has no navigator of its own).
globalThis.Window ??= class Window {};
Object.defineProperty(globalThis, 'navigator', {
  value: { gpu: create([]) },
  configurable: true,
});

const [dir, seedArg] = process.argv.slice(2);
const seed = Number(seedArg ?? Math.floor(Math.random() * 1e9));
const require = createRequire(import.meta.url);
const check = require(`${dir}/flash_attn_web_check.js`);
console.log(`wasm check, seed ${seed}`);
try {
  console.log(await check.run_checks(seed));
  process.exit(0);
} catch (e) {
  console.error(String(e));
  process.exit(1);
}
