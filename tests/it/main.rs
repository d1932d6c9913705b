//! End-to-end tests of the `memory-blade` and `compute-blade` binaries.

mod cli;
mod dtx;
