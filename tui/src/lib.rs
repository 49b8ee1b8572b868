//! The Switchyard console: the live view an operator attaches to a running daemon
//! (`switchyard console`), over the admin API's client and shapes (`switchyard-admin`).
//!
//! `state/` is the domain model the feed fills; `ui/` draws it, one file per pane; `app` holds
//! what is selected and open and runs the event loop; `conn` keeps the feed connected; `term`
//! owns the terminal.

pub mod app;
pub mod conn;
pub mod input;
pub mod state;
pub mod term;
pub mod ui;

use switchyard_admin::{AdminClient, Target};

pub use app::Error;

/// Runs the console on the terminal against the daemon at `target` until the operator quits.
pub async fn run(target: Target) -> Result<(), Error> {
    app::run(AdminClient::new(target)).await
}
