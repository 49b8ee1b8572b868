//! Logs (and, in later modules, the event bus, request records, metrics and the console feed).

use std::io::IsTerminal;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, fmt, reload};

/// The installed filter, which a reload of the config may replace.
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// `[log]`: the level, the format and the access log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `tracing` filter, e.g. `info` or `switchyard=debug,info`; `RUST_LOG` overrides it.
    pub level: String,
    /// `auto` (JSON when stderr is not a terminal), `json` or `text`.
    pub format: LogFormat,
    /// One line per finished request at `info` (target `switchyard::access`); off, those
    /// lines are `debug`.
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Auto,
            access: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Auto,
    Json,
    Text,
}

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
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    // A second initialisation (tests) is not an error worth failing over.
    let installed = if json {
        registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(
                fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
    if installed.is_ok() {
        let _ = FILTER.set(handle);
    }
}

/// What a new `[log] level` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LevelChange {
    Applied,
    /// `RUST_LOG` is set and wins over the config.
    OverriddenByEnv,
    /// No subscriber of this process's own (tests, embedding).
    NotInstalled,
}

/// Replaces the log filter with `level` (a `tracing` filter), unless `RUST_LOG` is set.
pub fn set_log_level(level: &str) -> Result<LevelChange, String> {
    if std::env::var_os("RUST_LOG").is_some_and(|v| !v.is_empty()) {
        return Ok(LevelChange::OverriddenByEnv);
    }
    let filter = EnvFilter::try_new(level).map_err(|e| format!("`{level}`: {e}"))?;
    match FILTER.get() {
        Some(handle) => handle
            .reload(filter)
            .map(|()| LevelChange::Applied)
            .map_err(|e| e.to_string()),
        None => Ok(LevelChange::NotInstalled),
    }
}

pub mod feed;
pub mod metrics;
pub mod records;
pub mod report;
pub mod windows;
