//! Helpers shared by the test binaries that run `exitless` as a process: the multiboot test
//! kernel under `exitless run` ([`testkernel`]) and a VM in the background driven by
//! `exitless ctl` ([`running`]).
// Each binary uses some of them.
#![allow(dead_code)]

pub mod running;
pub mod testkernel;
