//! The integration tests, as one test binary: one module per area, and the helpers they share
//! (`common`) built once for all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod accounts;
mod attacks;
mod bad_input;
mod bodies;
mod console_conn;
mod console_feed;
mod console_tui;
mod credits;
mod damaged;
mod demo;
mod edge;
mod egress;
mod faults;
mod foundation;
mod front_doors;
mod keys;
mod login;
mod matrix;
mod notify;
mod operations;
mod packaging;
mod probe;
mod proxy;
mod real_clients;
mod report;
mod rules;
mod scheduling;
mod sim;
mod sim_login;
mod sim_ws;
mod tiers;
mod upgrade;
mod upstream_face;
mod usage;
mod walkthrough;
mod warmup;
mod windows;
mod ws;
