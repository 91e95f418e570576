"""The benchmarks, by kind, each run as a module of the installed package from the checkout's
root (`python -m benchmarks.speed.data_throughput`): `speed` (throughput, step time, memory),
`experiments` (the runs behind a params choice), `checks` (does a path give the answers and bits
it should). Each rewrites its own section of benchmarks/RESULTS.md (`results`); `exported` finds
the task models a run exported."""
