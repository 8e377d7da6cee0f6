//! End-to-end tests: each one starts the real `orl` binary on a fresh database (SQLite in a
//! temporary directory, or a new PostgreSQL database) and drives it over HTTP.

mod call_log;
mod exposition;
mod support;

mod audit;
mod auth;
mod availability;
mod bindings;
mod booking_model;
mod bootstrap;
mod capacity_view;
mod cli;
mod compute;
mod dashboard;
mod devices;
mod earnings;
mod events_stream;
mod examples;
mod fleet;
mod graphql;
mod hostile_input;
mod iam_schema;
mod input;
mod invariants;
mod inventory;
mod keys;
mod node_reservations;
mod openapi;
mod orgs;
mod paging;
mod plugin_assignment;
mod plugin_containment;
mod plugin_logs;
mod plugins;
mod policy_versions;
mod races;
mod route_sweep;
mod settings;
mod spot;
mod system;
mod transitions;
mod visibility;
mod walkthrough;
