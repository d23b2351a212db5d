#!/bin/bash
# memory vs budget runs, interleaved; prints train seconds and per-rank comm seconds
. /work/wt/venv-mf-stream/bin/activate
export SCALEFREE_CACHE_DIR=/tmp/mfs-bench/c2
for rep in 1 2 3; do
for v in memory budget; do
  extra=""; [ $v = budget ] && extra="--memory-budget 5386794 --block-dir /tmp/mfs-bench"
  scalefree mf train /tmp/mfs-bench/syn2m.txt --mode rima -n 4 -k 40 -i 20 --seed 0 --eval-every 0 --json /tmp/mfs-bench/$v.jsonl -q $extra > /dev/null
  python3 -c "
import json; d=[json.loads(l) for l in open('/tmp/mfs-bench/$v.jsonl')][-1]
print('$v', round(d['seconds'],3), 'comm', [round(x,3) for x in d['comm_seconds']], 'wait', [round(sum(x),3) for x in zip(*[r['preload_wait_seconds'] for r in [json.loads(l) for l in open('/tmp/mfs-bench/$v.jsonl')]])] if 'preload_wait_seconds' in d else '')
"
done; done
