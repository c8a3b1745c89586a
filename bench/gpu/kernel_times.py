"""Summarises Nsight Compute's per-kernel durations (ncu --csv --page raw --metrics
gpu__time_duration.sum) of a run of forward passes (decode steps or prompts): splits the kernels
into steps at each embedding kernel, and for STEPS steps (the last ones, or those before the last
SKIP) prints the time per step spent in each kind of kernel.

    ncu ... --csv --page raw ... | python3 bench/gpu/kernel_times.py [STEPS [SKIP]]
"""
import collections
import csv
import re
import sys


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = re.sub(r"\(.*$", "", name)  # drop the argument list
    name = re.sub(r"^void ", "", name)
    return re.sub(r"^[A-Za-z_:]*::", "", name)


def main():
    steps_wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    rows = [r for r in csv.reader(line for line in sys.stdin if line.startswith('"'))]
    header = rows[0]
    name_col = header.index("Kernel Name")
    time_col = header.index("gpu__time_duration.sum")
    kernels = []
    for r in rows[2:]:
        try:
            kernels.append((short(r[name_col]), float(r[time_col].replace(",", ""))))
        except (ValueError, IndexError):
            continue
    steps, current = [], []
    for k in kernels:
        if k[0].startswith("EmbeddingKernel") and current:
            steps.append(current)
            current = []
        current.append(k)
    steps.append(current)
    if skip:
        steps = steps[:-skip]
    last = steps[-steps_wanted:]
    per_kind = collections.defaultdict(lambda: [0.0, 0])
    for step in last:
        for name, t in step:
            per_kind[name][0] += t / len(last)
            per_kind[name][1] += 1 / len(last)
    total = sum(v[0] for v in per_kind.values())
    print(f"{len(last)} steps, {len(last[0])} kernels a step, {total / 1e3:.1f} us of kernels a step")
    for name, (t, n) in sorted(per_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"{t / 1e3:9.1f} us  {n:5.0f} x {t / max(n, 1) / 1e3:7.2f} us  {name}")


if __name__ == "__main__":
    main()
