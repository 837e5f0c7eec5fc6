#!/bin/bash
# The guide's Cloud TPU example (a v5litepod-16: 4 hosts, 4 chips each) with
# jaxrun in place of `xargs ssh`: one controller per TPU host, over SSH.
#
#   TPU_NAME=jax-demo ZONE=us-central1-a examples/deploy/cloud_tpu.sh train.py --lr 3e-4
#
# Needs `jaxrun --hosts` (the SSH launcher) and the gcloud CLI.  Not tested on
# a real TPU.  WARNING: this calls the Cloud TPU API, copies files to every
# host and installs packages there; it changes remote machines and can cost
# money.  Check the project, zone, TPU name and SSH targets first, and never
# point it at production hosts.

set -euo pipefail

TPU_NAME=${TPU_NAME:?set TPU_NAME}
ZONE=${ZONE:?set ZONE}
SCRIPT=${1:?usage: $0 SCRIPT [ARGS...]}
shift
REMOTE_DIR=/tmp/jaxrun-job
PORT=${JAXRUN_PORT:-8476}

describe() {
    gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone "$ZONE" --format="$1"
}

# One line per host, worker 0 first.  jaxrun starts rank N on line N+1, so
# worker 0 is process 0 and hosts the coordination service.
hosts=$PWD/tpu-hosts.txt
describe 'value[delimiter="\n"](networkEndpoints[].accessConfig.externalIp)' > "$hosts"
# The workers reach each other on the internal network, so the coordinator is
# worker 0's internal address, not the external one used for SSH.
coordinator_ip=$(describe 'value[delimiter="\n"](networkEndpoints[].ipAddress)' | head -n 1)

# gcloud installs its SSH key on every worker; plain ssh then uses it.
ssh_config=$PWD/tpu-ssh.config
cat > "$ssh_config" <<CONFIG
Host *
    IdentityFile ~/.ssh/google_compute_engine
    StrictHostKeyChecking accept-new
CONFIG

# Same code and packages on every host (jax and jaxlib must match: jaxrun's
# preflight refuses to run with mixed versions).
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all \
    --command="mkdir -p $REMOTE_DIR && pip install -q -U 'jax[tpu]' jaxrun"
gcloud compute tpus tpu-vm scp "$SCRIPT" "$TPU_NAME:$REMOTE_DIR/" --zone "$ZONE" --worker=all

# jaxrun checks that SCRIPT exists here too, and runs it by the same relative
# name in --chdir on each host.
cd "$(dirname "$SCRIPT")"
# No --cpu-devices: each process uses its host's 4 TPU chips.  The timeout
# turns a hang (collectives issued in different orders) into stack dumps.
exec jaxrun --hosts "$hosts" --ssh-config "$ssh_config" \
    --coordinator "$coordinator_ip:$PORT" \
    --python python3 --chdir "$REMOTE_DIR" \
    --timeout 3600 \
    "$(basename "$SCRIPT")" "$@"
