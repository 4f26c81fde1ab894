//! `exitless bench`: scenarios that reproduce each technique's seed figure on this host, every
//! variant side by side in one run, reported as ratios first.
//!
//! Imports run one way, bottom to top:
//! - [`stats`] (medians, intervals, verdicts, the rounds' order);
//! - [`model`] (what a report holds) and [`format`] (how it writes numbers); [`host`], the host this
//!   runs on (its tap is `exitless_peer::host_tap`); [`progress`], the line on stderr while it runs;
//! - [`measure`] (probe runs into variants) and [`against`] (the same ops under another VMM);
//! - the scenarios: [`pci`], [`rr`], [`msix`], [`iommu`], [`soak`];
//! - [`chart`] (SVG charts), [`report`] (tables, JSON) and [`baseline`] (this run against a
//!   saved one);
//! - [`options`] (the command line's knobs) and [`session`] (one `exitless bench` run: the
//!   peer's boots, the host tap's lifetime, each scenario in turn, the report).

pub mod against;
pub mod baseline;
pub mod chart;
pub mod format;
pub mod host;
pub mod iommu;
pub mod measure;
pub mod model;
pub mod msix;
pub mod msix_vhost;
pub mod options;
pub mod pci;
pub mod progress;
pub mod report;
pub mod restore;
pub mod rr;
pub mod session;
pub mod soak;
pub mod stats;
pub mod vhost_net;
