#!/usr/bin/env bash
# The main job on the shipped default (the README's first command runs it):
#  1. tokenise the shipped corpus into shards (once; byte-level, inputs/data/),
#  2. check the process mesh and every collective on 4 oversubscribed ranks (2 stages x 2-way TP),
#  3. train the demo model (inputs/demo.ini) for a few minutes on one rank, save it in
#     HuggingFace format under out/demo/model, and print a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
exe=${MESHTRAIN_EXE:-build/cpu/src/meshtrain}
if ! ls inputs/data/kjv_train_*.bin >/dev/null 2>&1; then
  "$exe" prep --prep.input inputs/kjv.txt --prep.output inputs/data/kjv --prep.tokenizer byte
fi
jobs/local.sh -n 4 selfcheck --mesh.tp 2 --mesh.pp 2 --selfcheck.counts 0,7,1000
jobs/local.sh -n 1 train --config inputs/demo.ini "$@"
