#!/usr/bin/env bash
# The main job on the shipped default, run by the README's first command.
# Today: the process-mesh and communicator self-check on 4 oversubscribed ranks, as a 2x2
# (tp x dp) mesh and as a 2-stage pipeline x 2-way tensor-parallel mesh.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/jobs/local.sh" -n 4 selfcheck --mesh.tp 2
"$here/jobs/local.sh" -n 4 selfcheck --mesh.tp 2 --mesh.pp 2
