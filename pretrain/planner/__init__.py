"""The strategy planner: every valid parallel plan for a model, batch and cluster, with its predicted
memory per device and step time, ranked (`pipeline plan`, `pipeline pretrain --strategy auto`).

Read in this order; each module imports only those above it:

    cluster.py       the hardware model: devices, links, the ring model of collectives; cluster files
    profile.py       what is trained: the Workload and the model's profile, traced on the meta device
    candidates.py    every plan training accepts: degrees, DDP/FSDP/HSDP, schedules, microbatches, placement
    layout.py        where each rank of a plan runs, and the links its groups cross
    pipeline_sim.py  a pipeline schedule's real action order, run on a clock
    cost.py          estimate(): one plan's step time and memory, one function per concern
    rank.py          plan(): estimate every candidate, drop what does not fit, fastest first; the table
    measure.py       measuring this machine (a short real job), cached in the workspace
    auto.py          the planner from the CLI: `pipeline plan`'s inputs, --strategy auto, --autotune,
                     and the prediction a run logs beside what it measured

The planner imports training code (the model, ParallelConfig, and for measurements and --autotune the
trainer itself); training code never imports the planner.
"""
