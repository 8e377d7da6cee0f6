//! orl: a GPU capacity platform whose policies are WebAssembly.
//!
//! The crate is both the server (`orl serve`) and the command-line client. Each module is
//! one concern: domain rules are plain functions with no I/O, storage lives beside them in
//! a `store` submodule, and the HTTP surfaces in [`api`] stay thin.

pub mod api;
pub mod app;
pub mod audit;
pub mod backup;
pub mod bench;
pub mod booking;
pub mod capacity;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod condition;
pub mod dashboard;
pub mod demo;
pub mod earnings;
pub mod error;
pub mod events;
pub mod fleet;
pub mod graphql;
pub mod iam;
pub mod ids;
pub mod inventory;
pub mod metrics;
pub mod node_reservations;
pub mod placer;
pub mod policy;
pub mod pools;
pub mod progress;
pub mod reconciler;
pub mod replicas;
pub mod serve;
pub mod settings;
pub mod spot;
pub mod store;
pub mod validation;

pub use app::App;
pub use error::{Error, Result};
