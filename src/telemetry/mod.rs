//! Logs (and, in later modules, the event bus, request records, metrics and the console feed).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global `tracing` subscriber, writing to stderr (never stdout, which belongs to
/// command output). `RUST_LOG` overrides `level`. JSON when `format` says so, or when `auto` and
/// stderr is not a terminal (journald, files, pipes).
pub fn init_logging(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests) is not an error worth failing over.
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}

pub mod feed;
pub mod metrics;
pub mod records;
pub mod report;
pub mod windows;
