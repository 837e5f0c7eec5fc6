#!/usr/bin/env bash
# TPU smoke check (issue 71): jaxrun on a TPU host against a bare python, in about 8 minutes.
#
#   bash bench/tpu_smoke.sh [ROUNDS [STEPS]]        (default 3 rounds of 1500 steps)
#
# Each line it prints starts with "tpu_smoke:"; with TPU_SMOKE_JSON=FILE the figures go there too.
# 1. bench/tpu_train.py bare and under `jaxrun -n 1`, in alternating rounds: each run's median
#    step time (the script's own clock) and wall time; whether jaxrun's line is the bare one's;
# 2. goodput: the `work` of jaxrun's report against the script's own sum of step times, and the
#    time account's split of the process's time;
# 3. JAX's teardown lines: none on jaxrun's console, counted in its logs;
# 4. `jaxrun profile --seconds 2` on a running job given its chip by --devices-per-process 1: the
#    trace's TPU planes and their ops;
# 5. the parked job (HANG_AT=50) with --stall-timeout 8: when jaxrun stops it, if it does (45 s at most);
# 6. -n 2 on a host of one chip, and -n 2 --cpu-devices 1 where internet sockets are refused:
#    one line each, exit 2, before anything starts;
# 7. the host's time against the chip's (bench/tpu_host_time.sh, issue 76): STEPS steps with nothing
#    else, with 20 ms of numpy before each step, with 20 ms of time.sleep, the numpy loop waiting
#    for the chip every 10 steps and never; and one 30 s program at --stall-timeout 8 (runs to its
#    end, its time the program's, no stall): each part of the goodput against the script's own clock.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-1500}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
chips=$(python3 -c 'import os; from jaxrun.contract.devices import host_tpu_chips; print(len(host_tpu_chips(os.environ) or []))')
[ "$chips" -gt 0 ] || { echo "tpu_smoke: no TPU chip here; nothing to check"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "tpu_smoke: $chips TPU chip(s); jax $(python3 -c 'import jax; print(jax.__version__)'); $(nproc) cores"

# A command's console (stdout and stderr), each line with the seconds since its start, and its status.
cat > "$work/timed.py" <<'PY'
import json, subprocess, sys, time
out, argv = sys.argv[1], sys.argv[2:]
start = time.monotonic()
proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
lines = [[round(time.monotonic() - start, 3), line.rstrip("\n")] for line in proc.stdout]
code = proc.wait()
json.dump({"rc": code, "wall": round(time.monotonic() - start, 3), "lines": lines}, open(out, "w"))
PY
timed() { local out=$1; shift; python3 "$work/timed.py" "$out" "$@"; }

# 1, 2, 3: alternating rounds.
for r in $(seq "$rounds"); do
    timed "$work/bare-$r" python3 bench/tpu_train.py "$steps"
    timed "$work/jaxrun-$r" python3 -m jaxrun -n 1 --log-dir "$work/logs-$r" --report "$work/report-$r.json" \
        bench/tpu_train.py "$steps"
done

# 4: a profile of a running job, whose chip jaxrun gave it.
timed "$work/profiled" python3 -m jaxrun -n 1 --devices-per-process 1 --log-dir "$work/logs-profiled" \
    bench/tpu_train.py 4000 &
job=$!
sleep 20  # jaxrun's start, the chip's (about 10 s) and the first step; then its steps run for about 30 s
python3 -m jaxrun profile --seconds 2 > "$work/profile.out" 2>&1
echo "exit $?" >> "$work/profile.out"
wait "$job"

# 5: the parked job.
HANG_AT=50 timed "$work/parked" timeout -s TERM 45 python3 -m jaxrun -n 1 --stall-timeout 8 --grace 5 \
    --log-dir "$work/logs-parked" bench/tpu_train.py 300
# 6: refusals.
timed "$work/two" python3 -m jaxrun -n 2 bench/tpu_train.py 10
timed "$work/two-cpu" python3 -m jaxrun -n 2 --cpu-devices 1 bench/tpu_train.py 10

python3 - "$work" "$rounds" "${TPU_SMOKE_JSON:-}" <<'PY'
import glob, json, os, re, statistics, sys
work, rounds, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3]
NOISE = re.compile(r"WatchTasks|Error received from peer|failed to connect to all addresses")
SAME = ("platform", "kind", "devices", "processes", "loss")  # the script's line but for its clock's figures


def run(name):
    return json.load(open(os.path.join(work, name)))


def figures(r):
    for _, line in r["lines"]:
        m = re.search(r"\{\"platform\".*\}", line)
        if m:
            return json.loads(m.group(0))
    return None


def say(text):
    print(f"tpu_smoke: {text}", flush=True)


def tail(r, n=8):
    return " | ".join(line for _, line in r["lines"][-n:])


found = {"rounds": []}
for i in range(1, rounds + 1):
    bare, under = run(f"bare-{i}"), run(f"jaxrun-{i}")
    fb, fj = figures(bare), figures(under)
    try:
        report = json.load(open(os.path.join(work, f"report-{i}.json")))
    except OSError:
        report = {}
    parts = (report.get("goodput") or {}).get("parts", {})
    times = [p.get("time") for p in report.get("processes", [])]
    try:
        log = open(os.path.join(work, f"logs-{i}", "process-0.stderr"), errors="replace").read().splitlines()
    except OSError:
        log = []
    row = {"bare": fb, "jaxrun": fj, "bare_wall": bare["wall"], "jaxrun_wall": under["wall"], "jaxrun_rc": under["rc"],
           "goodput": report.get("goodput"), "time": times[0] if times else None,
           "same_line": bool(fb and fj and all(fb[k] == fj[k] for k in SAME)),
           "console_noise": [line for _, line in under["lines"] if NOISE.search(line)],
           "log_noise": [line for line in log if NOISE.search(line)]}
    row["work_vs_steps"] = round(parts["work"] / fj["steps_s"], 3) if parts.get("work") and fj else None
    found["rounds"].append(row)
    say(f"round {i}: bare {fb and fb['median_ms']} ms a step, wall {bare['wall']:.1f} s; jaxrun "
        f"{fj and fj['median_ms']} ms, wall {under['wall']:.1f} s, exit {under['rc']}; the script's line as bare: "
        f"{row['same_line']}; goodput {parts}; work / the script's steps {row['work_vs_steps']} (steps "
        f"{fj and fj['steps_s']} s, first step {fj and fj['first_s']} s); account {row['time']}; noise lines on the "
        f"console {len(row['console_noise'])}, in the log {len(row['log_noise'])}")
    if under["rc"] or not fj or row["console_noise"]:
        say("  its console's last lines: " + tail(under, 12))
    if bare["rc"] or not fb:
        say("  bare's last lines: " + tail(bare))
ok = [r for r in found["rounds"] if r["bare"] and r["jaxrun"]]
if ok:
    b = statistics.median(r["bare"]["median_ms"] for r in ok)
    j = statistics.median(r["jaxrun"]["median_ms"] for r in ok)
    found["step_ratio"] = round(j / b, 4)
    say(f"step time: jaxrun {j} ms against bare {b} ms (median of {len(ok)} rounds' medians): x{j / b:.4f}")
    say(f"wall: jaxrun {statistics.median(r['jaxrun_wall'] for r in ok):.1f} s against bare "
        f"{statistics.median(r['bare_wall'] for r in ok):.1f} s (medians)")
    if ok[0]["log_noise"]:
        say("the log's noise lines: " + " | ".join(ok[0]["log_noise"]))
profile = open(os.path.join(work, "profile.out")).read()
found["profile"] = profile.strip().splitlines()
say("profile: " + " | ".join(found["profile"]))
m = re.search(r"traced into (\S+)", profile)
if m:
    try:
        from jax.profiler import ProfileData
        for path in glob.glob(os.path.join(m.group(1), "*.xplane.pb")):
            planes = {}
            for plane in ProfileData.from_file(path).planes:
                if "TPU" in plane.name:
                    events = [e.name for line in plane.lines for e in line.events]
                    planes[plane.name] = [len(events), sorted(set(events))[:5]]
            found.setdefault("profile_planes", {})[os.path.basename(path)] = {
                "bytes": os.path.getsize(path), "tpu_planes": planes}
            say(f"profile: {os.path.basename(path)} {os.path.getsize(path)} bytes; TPU planes (events, some names) "
                f"{planes}")
    except Exception as e:  # the check's own failure, in one line
        say(f"profile: could not read the trace: {type(e).__name__}: {e}")
profiled = run("profiled")
say(f"the profiled job (--devices-per-process 1): exit {profiled['rc']}, {figures(profiled)}")
if profiled["rc"] or not figures(profiled):
    say("  its last lines: " + tail(profiled, 12))
parked = run("parked")
at = next((t for t, line in parked["lines"] if "parking at step" in line), None)
found["parked"] = {"rc": parked["rc"], "parked_at": at, "end": parked["wall"], "tail": tail(parked)}
say(f"parked job: parked at {at} s, jaxrun ended at {parked['wall']} s, exit {parked['rc']}"
    f"{' (the outside timeout: not stopped)' if parked['rc'] == 124 else ''}; its last lines: {tail(parked)}")
for name in ("two", "two-cpu"):
    r = run(name)
    found[name] = {"rc": r["rc"], "wall": r["wall"], "lines": [line for _, line in r["lines"]]}
    say(f"-n 2{' --cpu-devices 1' if name == 'two-cpu' else ''}: exit {r['rc']} in {r['wall']} s: {tail(r)}")
if dest:
    json.dump(found, open(dest, "w"), indent=1)
PY
# 7: the host's time, and the long program (their own lines, "host_time: ...").
bash bench/tpu_host_time.sh "${TPU_HOST_STEPS:-600}"  # the steps of issue 76's table
echo "tpu_smoke: done"
