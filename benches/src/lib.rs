//! nightshift-benches: shared helpers for the benchmarks and comparison binaries.
