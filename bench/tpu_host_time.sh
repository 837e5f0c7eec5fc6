#!/usr/bin/env bash
# The host's time against the chip's (issue 76), on a TPU host (or, smaller, anywhere): part of
# bench/tpu_smoke.sh, and runnable alone.
#
#   bash bench/tpu_host_time.sh [STEPS]        (default 600 steps a loop)
#
# bench/tpu_train.py's steps under `jaxrun -n 1`, each loop with its report: nothing but the steps;
# 20 ms of numpy before each step (STAGE=numpy: an input pipeline); 20 ms of time.sleep (STAGE=sleep);
# the numpy loop again waiting for the chip only every 10 steps, and never but after the last
# (EVERY=10, EVERY=0); then one program of about 30 s at --stall-timeout 8.  Each line starts with
# "host_time:" and sets the goodput's parts (work, input, idle, waiting, stall) against the script's
# own clock (its steps' time, its stage's time), with jaxrun's line on the host where it says one;
# the every-10 and never loops' work also against the chip's steps in the numpy loop that waits
# every step, and their host-wait share against the right one.
# TPU_HOST_D=1024 TPU_HOST_LONG_N=2048 make it small enough for a CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
steps=${1:-600}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for loop in plain numpy sleep numpy-every10 numpy-never; do
    case $loop in
        plain) stage="" every=1 ;;
        numpy) stage=numpy every=1 ;;
        sleep) stage=sleep every=1 ;;
        numpy-every10) stage=numpy every=10 ;;
        numpy-never) stage=numpy every=0 ;;
    esac
    STAGE=$stage EVERY=$every python3 -m jaxrun -n 1 --report "$work/$loop.json" --log-dir "$work/logs-$loop" \
        bench/tpu_train.py "$steps" > "$work/$loop.out" 2>&1
    echo "exit $?" >> "$work/$loop.out"
done
cat > "$work/long.py" <<'PY'
import json, os, sys, time
import jax, jax.numpy as jnp
from jax import lax
n = int(os.environ.get("TPU_HOST_LONG_N", "8192"))
w = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16) / 90
x = jnp.ones((n, n), jnp.bfloat16)
run = jax.jit(lambda x, w, k: lax.fori_loop(0, k, lambda i, x: jnp.tanh(x @ w), x))
run(x, w, 10).block_until_ready()
t = time.perf_counter(); run(x, w, 200).block_until_ready(); per = (time.perf_counter() - t) / 200
k = int(30 / per)
t = time.perf_counter(); run(x, w, k).block_until_ready(); took = time.perf_counter() - t
print(json.dumps({"program_s": round(took, 3), "matmuls": k}), flush=True)
PY
python3 -m jaxrun -n 1 --stall-timeout 8 --report "$work/long.json" --log-dir "$work/logs-long" \
    "$work/long.py" > "$work/long.out" 2>&1
echo "exit $?" >> "$work/long.out"

python3 - "$work" <<'PY'
import json, os, re, sys
work = sys.argv[1]


def said(name):
    text = open(os.path.join(work, name + ".out"), errors="replace").read()
    m = re.findall(r"\{\"(?:platform|program_s)\".*\}", text)
    try:
        report = json.load(open(os.path.join(work, name + ".json")))
    except (OSError, ValueError):
        report = {}
    return text, (json.loads(m[-1]) if m else None), report


for name in ("plain", "numpy", "sleep", "numpy-every10", "numpy-never", "long"):
    text, own, report = said(name)
    goodput = report.get("goodput") or {}
    parts = goodput.get("parts", {})
    time_ = [p.get("time") for p in report.get("processes", [])]
    line = [x for x in text.splitlines() if "waited for the host" in x or "made progress" in x]
    if own is None:
        print(f"host_time: {name}: no figures; its last lines: {' | '.join(text.splitlines()[-8:])}", flush=True)
        continue
    steps = own.get("steps_s", own.get("program_s"))
    ratio = round(parts["work"] / steps, 3) if parts.get("work") is not None and steps else None
    print(f"host_time: {name}: the script's clock: steps {steps} s, stage {own.get('stage_s', 0)} s "
          f"(median step {own.get('median_ms')} ms); goodput work {parts.get('work')} s (x{ratio} the steps), "
          f"input {parts.get('input')} s, idle {parts.get('idle')} s, waiting {parts.get('waiting')} s, "
          f"stall {parts.get('stall')} s, compile {parts.get('compile')} s, startup {parts.get('startup')} s; "
          f"at {goodput.get('input_at')} / {goodput.get('idle_at')}; account {time_[0] if time_ else None}; "
          f"{text.splitlines()[-1]}", flush=True)
    for x in line:
        print(f"host_time:   {x}", flush=True)

# A loop that waits only every N steps, or never: its own clock no longer holds the chip's
# steps, so set its work against the chip's time in the numpy loop that waits every step
# (the same steps), and its host-wait share against the right one: the stage less the part
# the chip computed under it, over the stage.
_, chip_own, _ = said("numpy")
chip = chip_own.get("steps_s") if chip_own else None
for name in ("numpy-every10", "numpy-never"):
    text, own, report = said(name)
    parts = (report.get("goodput") or {}).get("parts", {})
    if own is None or chip is None or parts.get("work") is None:
        print(f"host_time: {name}: no figures against the chip", flush=True)
        continue
    steps = sum(parts.get(p) or 0.0 for p in ("work", "waiting", "input", "idle"))
    share = (parts.get("input", 0) + parts.get("idle", 0)) / steps if steps else None
    stage = own.get("stage_s", 0.0)
    right = (stage - chip) / stage if stage and stage > chip else None
    print(f"host_time: {name} against the chip: the chip's steps {chip} s (the numpy loop, waiting every "
          f"step); goodput work {parts['work']} s (x{round(parts['work'] / chip, 3)} the chip's); the host-wait "
          f"share {share:.0%} (right: {right:.0%}, the stage {stage} s with the chip's steps under it)"
          if share is not None and right is not None else f"host_time: {name}: work {parts['work']} s", flush=True)
PY
