//! End-to-end tests of the `memory-blade` and `compute-blade` binaries.

mod blade_set;
mod btree;
mod cli;
mod cli_reference;
mod damage;
mod dtx;
mod failover;
mod hardening;
mod multi;
mod rebuild;
mod sim;
mod tables;
