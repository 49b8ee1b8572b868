//! The admin API client lives with the console (its crate speaks the admin wire model); the
//! management commands use it too.

pub use switchyard_tui::admin::{AdminClient, ClientError, Target};
