//! The contract of the Switchyard daemon's admin API, shared by the daemon (which fills the
//! shapes), the management commands and the console (which read them): the JSON shapes
//! ([`wire`], [`report`]), whose fields of a known set of names are enums that keep a name
//! they do not know, and the typed client ([`client`]) that is the one place outside the
//! daemon's router where a path of the API is spelt.
//!
//! Every path below is under the API's root, `/api/admin`.

pub mod client;
mod names;
pub mod report;
pub mod wire;

pub use client::{AdminClient, ClientError, FeedSocket, Target};
