#!/usr/bin/env bash
# Does this checkout behave as an older commit did? `pipeline plan --json` on a described cluster (three
# workloads), and `pipeline search --json` (7 SciFact queries x 3 modes) on a workspace the OLD code built,
# answered by the old code and by this one, compared byte for byte; then `pipeline status` of that workspace
# by this code. Both run with this checkout's .venv: `python DIR/cli.py` imports DIR's modules first.
#
#   bash benchmarks/behaviour_unchanged.sh c890d40      # the commit before issue 51's changes
set -uo pipefail
OLD_COMMIT=${1:?usage: behaviour_unchanged.sh COMMIT}
NEW=$(cd "$(dirname "$0")/.." && pwd)
PY=$NEW/.venv/bin/python
SCIFACT=$NEW/../shared/data/scifact
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
OLD=$W/old
mkdir "$OLD" && git -C "$NEW" archive "$OLD_COMMIT" | tar -x -C "$OLD"
cd "$W"
$PY -c "import sys; sys.path.insert(0, '$OLD'); from pretrain.planner.cluster import EXAMPLE_TOML; open('two_sites.toml', 'w').write(EXAMPLE_TOML)"

i=0
for args in "--preset large --seq-len 1024 --global-batch 64" "--preset medium --tp 1" "--preset tiny --top 50 --bf16"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    $PY "$OLD/cli.py" plan -w plans --cluster two_sites.toml $args --json > "plan_old_$i.json"
    # shellcheck disable=SC2086
    $PY "$NEW/cli.py" plan -w plans --cluster two_sites.toml $args --json > "plan_new_$i.json"
    if cmp -s "plan_old_$i.json" "plan_new_$i.json"; then verdict=identical; else verdict=DIFFERENT; fi
    echo "plan --json $args: $verdict ($(wc -c < "plan_new_$i.json") bytes)"
done

head -200 "$SCIFACT/corpus.jsonl" > corpus.jsonl
{
    $PY "$OLD/cli.py" pretrain -w ws --data corpus.jsonl --preset tiny --n-layer 2 --n-head 2 --n-embd 32 \
        --seq-len 32 --batch-size 8 --vocab-size 400 --max-steps 30 &&
        $PY "$OLD/cli.py" embed -w ws --chunk-tokens 64 --overlap 8 &&
        $PY "$OLD/cli.py" index -w ws
} > old_build.log 2>&1 || { echo "the old code could not build the workspace:"; tail -5 old_build.log; exit 1; }
head -7 "$SCIFACT/queries.jsonl" | $PY -c "import sys, json; [print(json.loads(l)['text']) for l in sys.stdin]" > queries.txt
same=0 total=0
while read -r query; do
    for mode in lexical dense hybrid; do
        total=$((total + 1))
        $PY "$OLD/cli.py" search -w ws "$query" -k 10 --mode "$mode" --json > old.json 2> /dev/null
        $PY "$NEW/cli.py" search -w ws "$query" -k 10 --mode "$mode" --json > new.json 2> new.err
        if [ -s new.json ] && cmp -s old.json new.json; then
            same=$((same + 1))
        else
            echo "different: --mode $mode \"$query\""; tail -2 new.err
        fi
    done
done < queries.txt
echo "search --json on a workspace built by $OLD_COMMIT: $same of $total answers identical"
$PY "$NEW/cli.py" status -w ws
