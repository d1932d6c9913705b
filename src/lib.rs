//! # smart (the binaries' library)
//!
//! `memory-blade` and `compute-blade` are thin: `main` parses the flags
//! ([`cli`]: what was typed), resolves them once into a validated
//! configuration ([`config`]: what to do), runs the subcommand
//! ([`commands`]) and reports ([`report`]). [`merge`] combines the records
//! of compute blades that ran together; [`verbs_info`] says what this host
//! offers the verbs backend; [`coord`] runs the FORD subcommands under a
//! coordinator's configuration (`--coordinator`); [`pace`] paces an online
//! rebuild's copy. Both binaries share the
//! transport flags ([`cli::LinkFlags`]).

#![warn(missing_docs)]

pub mod cli;
pub mod commands;
pub mod config;
pub mod coord;
pub mod merge;
pub mod pace;
pub mod report;
pub mod verbs_info;
