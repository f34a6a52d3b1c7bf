#!/usr/bin/env python3
"""The GPU run's results, rewritten after every step by scripts/gpu-run.sh: summary.md (what a
person reads first), results.json (the same, with every record the benches wrote) and
logs.tar.gz (every log and table), directly in --out. A run killed at any point leaves the
files of its last finished step.

  python3 scripts/gpu_report.py --steps steps.tsv --logs LOGDIR --out OUT --mode full \
      --deadline 480 --elapsed 123

steps.tsv: one line a step, tab-separated: name, status, seconds, budget, detail, log file.
"""
import argparse
import io
import json
import os
import re
import tarfile
import time

# Tables a step leaves in the log folder, shown in summary.md in this order.
TABLES = [
    ("CUDA path, PyTorch SDPA (flash, cuDNN) and wgpu on the same shapes", "compare.md"),
    ("Decode, wgpu", "decode-wgpu.log"),
    ("Decode, 8-bit KV caches (q8_0, E4M3) beside the f16 cache, wgpu", "decode-8-bit-wgpu.log"),
    ("Decode, MLA (576/512, q chunks both ways), wgpu", "decode-MLA-wgpu.log"),
    ("Decode, CUDA", "decode-CUDA.log"),
    ("wgpu bench grid", "bench.md"),
]
# Records a step leaves, carried whole in results.json.
RECORDS = ["cmp-cuda.json", "cmp-sdpa.json", "cmp-wgpu.json", "compare.json", "bench.json",
           "decode-cuda.json"]

# Peak figures by the GPU name nvidia-smi reports (exact match), for the percent-of-peak
# columns. Source: NVIDIA's H200 Tensor Core GPU datasheet
# (https://www.nvidia.com/en-us/data-center/h200/): BF16 and FP16 Tensor Core 1,979 TFLOP/s
# (H200 SXM) and 1,671 (H200 NVL), both "with sparsity", so dense is half of each; FP32
# 67 and 60 TFLOP/s; GPU memory bandwidth 4.8 TB/s on both. Datasheet (boost-clock) figures,
# not measured: a run at lower clocks (machine.log records them) cannot reach them.
PEAKS = {
    "NVIDIA H200": dict(tensor_tflops=989.5, fp32_tflops=67.0, hbm_tbps=4.8),
    "NVIDIA H200 NVL": dict(tensor_tflops=835.5, fp32_tflops=60.0, hbm_tbps=4.8),
}
PEAK_SOURCE = ("NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): "
               "dense BF16/FP16 tensor = half the 'with sparsity' figure; FP32; HBM bandwidth")
# the nvidia-smi query the machine step prints (scripts/gpu-run.sh), as its CSV header
GPU_QUERY_PREFIX = "nvidia-smi query: "


def read_steps(path):
    steps = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 6:
                continue
            name, status, secs, budget, detail, log = parts[:6]
            steps.append(dict(name=name, status=status, seconds=int(secs or 0),
                              budget_s=int(budget or 0), detail=detail, log=log or None))
    return steps


def tail(path, lines):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def test_line(path):
    """libtest's closing line, and whether the CUDA half said it skipped."""
    result, skipped = None, None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("test result:"):
                    result = line.strip()
                if "CUDA half skipped" in line:
                    skipped = line.strip()
    except OSError:
        pass
    return result, skipped


def gpu_facts(machine_log):
    """The GPU's name, driver, clocks and the like from the machine step's nvidia-smi query
    (two lines: the CSV header, then the first GPU's values), or {}."""
    lines = [ln[len(GPU_QUERY_PREFIX):] for ln in machine_log.splitlines()
             if ln.startswith(GPU_QUERY_PREFIX)]
    if len(lines) < 2:
        return {}
    head = [h.strip() for h in lines[0].split(",")]
    vals = [v.strip() for v in lines[1].split(",")]
    return dict(zip(head, vals)) if len(head) == len(vals) else {}


def cell_number(cell):
    """The first number in a table cell ("12.3", "0.00225 (rows)", "1.2e+03"), or None."""
    for tok in cell.replace("[", " ").replace("(", " ").split():
        try:
            x = float(tok)
        except ValueError:
            continue
        return x if x == x else None  # NaN: no number
    return None


def throughput_kind(header):
    """(what, scale to the peak's unit) for a throughput column's header, else None:
    FLOP/s against TFLOP/s peaks, bytes/s against TB/s."""
    h = header.strip()
    if "TFLOP/s" in h:
        return ("flops", 1.0)
    if "GFLOP/s" in h:
        return ("flops", 1e-3)
    if "TB/s" in h:
        return ("bytes", 1.0)
    if "GB/s" in h:
        return ("bytes", 1e-3)
    return None


# a markdown row's cell separators: "|" not escaped as "\|" (the grid's notes escape theirs)
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def with_peak_columns(rows, peak):
    """Markdown table lines with a "% peak" column after every throughput column: FLOP/s
    over the dense tensor peak (f16, bf16) or the FP32 peak (rows whose dtype is f32),
    bytes/s over the HBM bandwidth; "-" where there is no peak for this GPU or no number."""
    out, kinds, dtype_col = [], None, None
    for i, line in enumerate(rows):
        cells = CELL_SPLIT.split(line.strip()[1:-1] if line.strip().endswith("|")
                                 else line.strip()[1:])
        is_sep = all(set(c.strip()) <= set("-: ") and c.strip() for c in cells)
        nxt = rows[i + 1] if i + 1 < len(rows) else ""
        if not is_sep and nxt.startswith("|---"):
            # a header: which columns are throughputs
            kinds = [throughput_kind(c) for c in cells]
            dtype_col = next((j for j, c in enumerate(cells) if c.strip() == "dtype"), None)
            new = []
            for c, k in zip(cells, kinds):
                new.append(c)
                if k:
                    new.append(" % peak ")
            out.append("|" + "|".join(new) + "|")
            continue
        if kinds is None or len(cells) != len(kinds):
            out.append(line)  # a note inside a table, or no header yet
            continue
        if is_sep:
            out.append("|" + "---|" * (len(cells) + sum(1 for k in kinds if k)))
            continue
        dtype = cells[dtype_col].strip() if dtype_col is not None else ""
        new = []
        for c, k in zip(cells, kinds):
            new.append(c)
            if not k:
                continue
            x = cell_number(c)
            what, scale = k
            p = None
            if peak and what == "bytes":
                p = peak["hbm_tbps"]
            elif peak:
                p = peak["fp32_tflops"] if dtype == "f32" else peak["tensor_tflops"]
            new.append(f" {100.0 * x * scale / p:.3g}% " if p and x is not None else " - ")
        out.append("|" + "|".join(new) + "|")
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", required=True)
    p.add_argument("--logs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="full")
    p.add_argument("--deadline", type=int, default=0)
    p.add_argument("--elapsed", type=int, default=0)
    a = p.parse_args()
    steps = read_steps(a.steps)
    for s in steps:
        if s["name"].startswith("tests") and s["log"]:
            result, skipped = test_line(os.path.join(a.logs, s["log"]))
            s["tests"] = result
            if skipped:
                s["cuda"] = f"skipped: {skipped}"
    machine = tail(os.path.join(a.logs, "machine.log"), 40)
    adapter = tail(os.path.join(a.logs, "adapter.log"), 40)
    cuda = tail(os.path.join(a.logs, "CUDA-device.log"), 10)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        with open(os.path.join(a.logs, "machine.log"), errors="replace") as f:
            gpu = gpu_facts(f.read())
    except OSError:
        gpu = {}
    gpu_name = gpu.get("name", "")
    peak = PEAKS.get(gpu_name)

    md = io.StringIO()
    w = md.write
    failed = [s for s in steps if s["status"].startswith("FAILED")]
    w(f"# GPU run ({a.mode} mode)\n\n{when}: {len(steps)} steps so far in {a.elapsed} s "
      f"(deadline {a.deadline} s); {len(failed)} failed.\n\n")
    w("## GPU and peak figures\n\n")
    if gpu:
        w("| " + " | ".join(gpu) + " |\n|" + "---|" * len(gpu) + "\n| "
          + " | ".join(gpu.values()) + " |\n\n")
    else:
        w("No nvidia-smi query in machine.log (no NVIDIA GPU seen).\n\n")
    if peak:
        w(f"Peaks for {gpu_name}: dense BF16/FP16 tensor {peak['tensor_tflops']} TFLOP/s, "
          f"FP32 {peak['fp32_tflops']} TFLOP/s, HBM {peak['hbm_tbps']} TB/s ({PEAK_SOURCE}). "
          "Every \"% peak\" column below divides the throughput to its left by one of them: "
          "FLOP/s of f16/bf16 rows by the tensor peak, of f32 rows by the FP32 peak, bytes/s "
          "by the HBM bandwidth.\n\n")
    else:
        w(f"No peak figures for {gpu_name or 'this machine'} (scripts/gpu_report.py, PEAKS): "
          "the \"% peak\" columns are empty.\n\n")
    w("## Machine, adapter, CUDA device\n\n```\n" + machine + adapter + cuda + "```\n\n")
    w("## Steps\n\n| step | status | seconds | budget | detail | log |\n|---|---|---|---|---|---|\n")
    for s in steps:
        extra = ""
        if s.get("tests"):
            extra += f"; {s['tests']}"
        if s.get("cuda"):
            extra += f"; **CUDA {s['cuda']}**"
        status = s["status"] if s["status"] in ("ok",) or s["status"].startswith("skipped") \
            else f"**{s['status']}**"
        w(f"| {s['name']} | {status} | {s['seconds']} | {s['budget_s']} | "
          f"{s['detail']}{extra} | {s['log'] or '-'} |\n")
    for title, name in TABLES:
        # whole: a table's header is at its top
        text = tail(os.path.join(a.logs, name), 100000)
        if not text:
            continue
        rows = [line for line in text.splitlines()
                if line.startswith("|") and "| skipped: " not in line]
        if rows:
            w(f"\n## {title}\n\n" + "\n".join(with_peak_columns(rows, peak)) + "\n")
    for s in failed:
        if s["log"]:
            w(f"\n## {s['name']}: last lines of {s['log']}\n\n```\n"
              + tail(os.path.join(a.logs, s["log"]), 20) + "```\n")

    records = {}
    for name in RECORDS:
        try:
            with open(os.path.join(a.logs, name)) as f:
                records[name] = json.load(f)
        except (OSError, ValueError):
            pass
    results = dict(when=when, mode=a.mode, deadline_s=a.deadline, elapsed_s=a.elapsed,
                   gpu=gpu, peak=dict(peak, source=PEAK_SOURCE) if peak else None,
                   machine=machine, adapter=adapter, cuda_device=cuda, steps=steps,
                   records=records)

    os.makedirs(a.out, exist_ok=True)
    # written beside, then renamed: a kill mid-write leaves the previous step's file whole
    for name, text in (("summary.md", md.getvalue()),
                       ("results.json", json.dumps(results, indent=1))):
        tmp = os.path.join(a.out, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(a.out, name))
    tmp = os.path.join(a.out, ".logs.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as t:
        for name in sorted(os.listdir(a.logs)):
            t.add(os.path.join(a.logs, name), arcname=f"logs/{name}")
    os.replace(tmp, os.path.join(a.out, "logs.tar.gz"))


if __name__ == "__main__":
    main()
