#!/usr/bin/env bash
# A GPU host this machine can reach over the network needs none of this: start a Ray cluster and run
# `dyntc reproduce ... --executor ray --address HEAD_IP:6379` (docs/cluster.md); results stay here.
# Prepares .gpu/ for a GPU host that is sent the work tree but reaches no package index (docs/reproduction.md, "GloVe without the package"):
# each dataset's folder from the data directory, and the GloVe vectors of its words (`dyntc export-glove`,
# the same vocabulary and vectors bit for bit). There, from the source tree:
#   export PYTHONPATH=$PWD/src DYNTC_DATA=$PWD/.gpu/data
#   python3 -m dyntc reproduce --dataset news ... --device cuda --jobs 5 --embeddings .gpu/glove-news.txt --out DIR
# .gpu/ is git-ignored: send it with the command, with the run's --out directory.
# Bring the run back as one archive, not as its files: a host that returns few files (8, 16 MiB each, two
# folders deep, as one such host did on 2026-11-26) drops results.json and checkpoints/ otherwise:
#   tar czf - -C RUNS_PARENT . | split -b 15m - RETURN_DIR/run.tgz.     (here: cat run.tgz.* | tar xzf -)
# Usage: DYNTC_DATA=../shared/datasets bash scripts/gpu_bundle.sh news [sent ...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: bash scripts/gpu_bundle.sh DATASET [DATASET ...] (e.g. news)" >&2; exit 2; }
[ -x .venv/bin/python ] || { echo "gpu_bundle: no .venv here: run bash scripts/setup.sh first" >&2; exit 1; }
mkdir -p .gpu/data
for dataset in "$@"; do
  # the dataset's folder in the data directory (an unknown name: one line naming the known ones)
  source_dir=$(.venv/bin/python -c "import sys
from dyntc.protocol.data.datasets import DATASETS, data_root, resolve_name
from dyntc.errors import DyntcError
try:
    print(data_root() / DATASETS[resolve_name(sys.argv[1])].folder)
except DyntcError as exc:
    sys.exit(f'gpu_bundle: {exc}')" "$dataset")
  folder=$(basename "$source_dir")
  [ -d "$source_dir" ] || { echo "gpu_bundle: $source_dir not found (set DYNTC_DATA to the data directory)" >&2; exit 1; }
  rm -rf ".gpu/data/$folder" && cp -r "$source_dir" .gpu/data/ && chmod -R u+w ".gpu/data/$folder"
  .venv/bin/dyntc export-glove --dataset "$dataset" --out ".gpu/glove-$dataset.txt"
done
du -sh .gpu
