//! The Switchyard console: the admin API's wire model and client, and the live console that an
//! operator attaches to a running daemon (`switchyard console`).
//!
//! `state/` is the domain model the feed fills; `ui/` draws it, one file per pane; `app` holds
//! what is selected and open and runs the event loop; `conn` keeps the feed connected; `term`
//! owns the terminal.

pub mod admin;
pub mod app;
pub mod conn;
pub mod input;
pub mod report;
pub mod state;
pub mod term;
pub mod ui;
pub mod wire;

pub use app::Error;

/// Runs the console on the terminal against the daemon at `target` until the operator quits.
pub async fn run(target: admin::Target) -> Result<(), Error> {
    app::run(admin::AdminClient::new(target)).await
}
