"""Reports what one controller was told about its rank, as one marked JSON line.

The scheduler's own variables show who started the process: srun sets
SLURM_STEP_ID and SLURM_PROCID, mpirun sets OMPI_COMM_WORLD_RANK.  A run that
quietly fell back to local processes has none of them.
"""

import json
import os
import sys

NAMES = ("JAXRUN_PROCESS_ID", "SLURM_STEP_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
print("rank-probe " + json.dumps({"argv": sys.argv[1:], "env": {n: os.environ.get(n) for n in NAMES}}))
