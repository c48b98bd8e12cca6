#!/bin/bash
# Run a command and print its wall time and how many of the machine's cores were busy meanwhile, from
# /proc/stat: every process counts (Ray's and torchrun's too, which /usr/bin/time does not see).
# usage: bash benchmarks/machine_busy.sh COMMAND...   (e.g. .venv/bin/python -m pytest -q -m ray)
read -r _ u n s i w x y z _ < /proc/stat; busy0=$((u + n + s + x + y + z)); all0=$((busy0 + i + w))
start=$(date +%s.%N)
"$@"; status=$?
read -r _ u n s i w x y z _ < /proc/stat; busy1=$((u + n + s + x + y + z)); all1=$((busy1 + i + w))
end=$(date +%s.%N)
python3 -c "import os, sys; wall, busy, cores = float(sys.argv[2]) - float(sys.argv[1]), int(sys.argv[3]) / int(sys.argv[4]), os.cpu_count(); \
print(f'wall {wall:.1f} s, busy cores {cores * busy:.2f}, machine CPU {wall * cores * busy:.0f} s')" \
    "$start" "$end" $((busy1 - busy0)) $((all1 - all0))
exit $status
