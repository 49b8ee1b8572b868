//! Reloading the configuration while serving (SIGHUP, `switchyard reload`, `ExecReload=`):
//! the whole file is read again and [`LiveConfig::apply`] applies what can change live —
//! scheduling, model aliases, the request limits that do not depend on a key (deadlines and
//! timeouts of the dispatcher, retention, the shutdown grace), the metrics token and the log
//! level. Requests in flight keep the values they started with; the next request gets the new
//! ones. What only a restart changes (listeners, the state directory, the upstream client) is
//! named in the log and in the answer. A later section of the file joins by one more arm in
//! `LiveConfig::apply`.

use std::sync::{Arc, RwLock};

use switchyard_admin::wire;

use super::systemd::Notifier;
use crate::api::{AppState, Reloader};
use crate::config::{Config, ConfigError, Source};
use crate::dispatch::DispatchConfig;
use crate::telemetry::{self, LevelChange};

/// The configuration of a running daemon: the one it started with (what a restart would
/// change is measured against it), the one in force (replaced by a reload), and where it is
/// read again.
#[derive(Debug)]
pub struct LiveConfig {
    started: Arc<Config>,
    current: RwLock<Arc<Config>>,
    /// `None`: only a sent configuration (or the defaults) applies on a reload.
    source: Option<Source>,
    /// Tells systemd about reloads.
    notifier: Notifier,
}

impl LiveConfig {
    pub fn new(config: Config, source: Option<Source>, notifier: Notifier) -> LiveConfig {
        let config = Arc::new(config);
        LiveConfig {
            started: Arc::clone(&config),
            current: RwLock::new(config),
            source,
            notifier,
        }
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Config> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Applies a re-read configuration to `state`: what can change live at once, what cannot
    /// is listed as waiting for a restart (measured against the configuration the daemon
    /// started with).
    pub fn apply(&self, state: &AppState, new: &Config) -> wire::Reloaded {
        let old = self.current();
        let mut applied: Vec<&str> = Vec::new();
        if old.scheduling != new.scheduling {
            let effective = state.fleet.set_base(new.scheduling.clone());
            tracing::info!(
                strategy = effective.strategy.as_str(),
                "scheduling settings reloaded"
            );
            applied.push("scheduling");
        }
        if old.models != new.models {
            applied.push("models");
        }
        if old.rules != new.rules {
            state.fleet.set_rules(new.rules.clone());
            applied.push("rules");
        }
        let dispatch = dispatch_config(new);
        if dispatch != dispatch_config(&old) {
            for (name, changed) in [
                (
                    "upstream.request_deadline",
                    old.upstream.request_deadline != new.upstream.request_deadline,
                ),
                (
                    "upstream.first_output_timeout",
                    old.upstream.first_output_timeout != new.upstream.first_output_timeout,
                ),
                (
                    "upstream.stream_idle_timeout",
                    old.upstream.stream_idle_timeout != new.upstream.stream_idle_timeout,
                ),
                (
                    "upstream.probe_model",
                    old.upstream.probe_model != new.upstream.probe_model,
                ),
                (
                    "server.keepalive_after",
                    old.server.keepalive_after != new.server.keepalive_after,
                ),
                (
                    "upstream.first_output_switches",
                    old.upstream.first_output_switches != new.upstream.first_output_switches,
                ),
                ("log.access", old.log.access != new.log.access),
            ] {
                if changed {
                    applied.push(name);
                }
            }
            state.dispatcher.set_config(dispatch);
        }
        if old.storage.request_retention_days != new.storage.request_retention_days
            || old.storage.usage_retention_days != new.storage.usage_retention_days
        {
            applied.push("storage retention");
        }
        if old.server.shutdown_grace != new.server.shutdown_grace {
            applied.push("server.shutdown_grace");
        }
        if old.admin.metrics_token != new.admin.metrics_token {
            *state
                .metrics_token
                .write()
                .unwrap_or_else(|e| e.into_inner()) = new.admin.metrics_token.clone();
            applied.push("admin.metrics_token");
        }
        if old.log.level != new.log.level {
            match telemetry::set_log_level(&new.log.level) {
                Ok(LevelChange::Applied | LevelChange::NotInstalled) => applied.push("log.level"),
                Ok(LevelChange::OverriddenByEnv) => tracing::warn!(
                    level = %new.log.level,
                    "RUST_LOG is set and wins over [log] level; the level stays"
                ),
                Err(e) => tracing::warn!(error = %e, "[log] level not applied"),
            }
        }
        let restart_needed = restart_needed(&self.started, new);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new.clone());
        if !restart_needed.is_empty() {
            tracing::warn!(
                settings = %restart_needed.join(", "),
                "these settings changed but apply only at the next restart"
            );
        }
        tracing::info!(applied = %applied.join(", "), "configuration reloaded");
        wire::Reloaded {
            applied: applied.into_iter().map(str::to_string).collect(),
            restart_needed,
        }
    }

    /// Reads the configuration again (from `text` when given, else from where it came from at
    /// start) and applies it, telling systemd (`RELOADING=1`, then `READY=1`).
    pub fn reload(
        &self,
        state: &AppState,
        text: Option<&str>,
    ) -> Result<wire::Reloaded, ConfigError> {
        self.notifier.notify_or_log("RELOADING=1");
        let source = self.source.clone().unwrap_or_default();
        let result = source
            .load(text, &crate::config::process_env)
            .map(|config| self.apply(state, &config));
        if let Err(e) = &result {
            tracing::error!(error = %e, "configuration not reloaded; the running one stays");
        }
        self.notifier.notify_or_log("READY=1");
        result
    }
}

impl Reloader for LiveConfig {
    fn reload(&self, state: &AppState, text: Option<&str>) -> Result<wire::Reloaded, String> {
        LiveConfig::reload(self, state, text).map_err(|e| e.to_string())
    }
}

/// The dispatcher's tunables from the config.
pub(super) fn dispatch_config(config: &Config) -> DispatchConfig {
    DispatchConfig {
        keepalive_after: config.server.keepalive_after,
        stream_idle_timeout: config.upstream.stream_idle_timeout,
        first_output_timeout: Some(config.upstream.first_output_timeout).filter(|d| !d.is_zero()),
        aliases: config.models.aliases.clone(),
        request_deadline: config.upstream.request_deadline,
        client_write_timeout: config.server.client_write_timeout,
        probe_model: config.upstream.probe_model.clone(),
        first_output_switches: config.upstream.first_output_switches,
        access_log: config.log.access,
        credits: config.credits.clone(),
        warmup: config.warmup.clone(),
        anthropic: config.front_doors.anthropic.clone(),
        images: config.front_doors.images.clone(),
        ..DispatchConfig::default()
    }
}

/// The settings that differ from the ones the daemon started with and only a restart applies.
fn restart_needed(started: &Config, new: &Config) -> Vec<String> {
    let (s, n) = (started, new);
    let checks = [
        ("server.listen", s.server.listen != n.server.listen),
        (
            "server.max_body_bytes, body_timeout, body_min_rate, key_memory_mib",
            s.server.max_body_bytes != n.server.max_body_bytes
                || s.server.key_memory_mib != n.server.key_memory_mib
                || s.server.body_timeout != n.server.body_timeout
                || s.server.body_min_rate != n.server.body_min_rate,
        ),
        (
            "server.ws_*",
            s.server.ws_first_message_timeout != n.server.ws_first_message_timeout
                || s.server.ws_idle_timeout != n.server.ws_idle_timeout
                || s.server.ws_max_connections_per_key != n.server.ws_max_connections_per_key,
        ),
        (
            "server connection limits",
            s.server.client_write_timeout != n.server.client_write_timeout
                || s.server.header_read_timeout != n.server.header_read_timeout
                || s.server.keepalive_idle_timeout != n.server.keepalive_idle_timeout
                || s.server.max_connections != n.server.max_connections,
        ),
        (
            "storage.state_dir",
            s.storage.state_dir != n.storage.state_dir,
        ),
        (
            "storage.cache_mib",
            s.storage.cache_mib != n.storage.cache_mib,
        ),
        ("admin.socket", s.admin.socket != n.admin.socket),
        ("notify", s.notify != n.notify),
        ("admin.token", s.admin.token != n.admin.token),
        (
            "upstream (endpoints, proxy, client timeouts)",
            s.upstream.base_url != n.upstream.base_url
                || s.upstream.usage_url != n.upstream.usage_url
                || s.upstream.oauth_token_url != n.upstream.oauth_token_url
                || s.upstream.auth_base_url != n.upstream.auth_base_url
                || s.upstream.oauth_client_id != n.upstream.oauth_client_id
                || s.upstream.connect_timeout != n.upstream.connect_timeout
                || s.upstream.header_timeout != n.upstream.header_timeout
                || s.upstream.client_version != n.upstream.client_version
                || s.upstream.use_env_proxy != n.upstream.use_env_proxy
                || s.upstream.proxy != n.upstream.proxy,
        ),
        ("log.format", s.log.format != n.log.format),
    ];
    checks
        .into_iter()
        .filter(|(_, changed)| *changed)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Reloads on every SIGHUP until the task is aborted.
pub fn on_sighup(state: Arc<AppState>, live: Arc<LiveConfig>) -> tokio::task::JoinHandle<()> {
    let hangup = super::signals::listen(&[super::signals::Signal::Hangup]);
    tokio::spawn(async move {
        let Ok(mut hangup) = hangup else {
            tracing::warn!("cannot listen for SIGHUP; reload with `switchyard reload`");
            return;
        };
        loop {
            hangup.next().await;
            tracing::info!("SIGHUP: reading the configuration again");
            let _ = live.reload(&state, None);
        }
    })
}
