//! Whole-system benchmarks, run by hand (figures go in `docs/benchmarks.md`).

pub mod agreement;
pub mod nodes;
