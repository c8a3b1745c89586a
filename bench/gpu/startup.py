"""Startup time of `dinfer generate` on a checkpoint on disk: process start to the first generated
token (one token of a 4-token prompt on the GPU; the weights' load dominates). Measured with the
page cache dropped (the checkpoint read from disk), then again with the file cached.

    python3 bench/gpu/startup.py DINFER_BINARY CHECKPOINT_DIR OUT.json
"""
import json
import subprocess
import sys
import time


def drop_caches():
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run(binary, model):
    start = time.monotonic()
    p = subprocess.run([binary, "generate", "-m", model, "--device", "cuda", "--prompt-ids",
                        "1,2,3,4", "-n", "1", "--print-ids"], capture_output=True, text=True)
    seconds = time.monotonic() - start
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"dinfer generate failed ({p.returncode})")
    return seconds


def main():
    binary, model, dest = sys.argv[1:4]
    dropped = drop_caches()
    cold = run(binary, model)
    warm = run(binary, model)
    res = {"startup_s": cold, "startup_cached_s": warm, "page_cache_dropped": dropped,
           "command": "dinfer generate -m DIR --device cuda --prompt-ids 1,2,3,4 -n 1 --print-ids"}
    with open(dest, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
