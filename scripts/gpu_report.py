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
import tarfile
import time

# Tables a step leaves in the log folder, shown in summary.md in this order.
TABLES = [
    ("CUDA path, PyTorch SDPA (flash) and wgpu on the same shapes", "compare.md"),
    ("Decode, wgpu", "decode-wgpu.log"),
    ("Decode, MLA (576/512, q chunks both ways), wgpu", "decode-MLA-wgpu.log"),
    ("Decode, CUDA", "decode-CUDA.log"),
    ("wgpu bench grid", "bench.md"),
]
# Records a step leaves, carried whole in results.json.
RECORDS = ["cmp-cuda.json", "cmp-sdpa.json", "cmp-wgpu.json", "compare.json", "bench.json"]


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

    md = io.StringIO()
    w = md.write
    failed = [s for s in steps if s["status"].startswith("FAILED")]
    w(f"# GPU run ({a.mode} mode)\n\n{when}: {len(steps)} steps so far in {a.elapsed} s "
      f"(deadline {a.deadline} s); {len(failed)} failed.\n\n")
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
        text = tail(os.path.join(a.logs, name), 200)
        if not text:
            continue
        rows = [line for line in text.splitlines()
                if line.startswith("|") and "| skipped: " not in line]
        if rows:
            w(f"\n## {title}\n\n" + "\n".join(rows) + "\n")
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
