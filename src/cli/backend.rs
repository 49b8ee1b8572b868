//! Where a management command does its work: through a running daemon's admin API (so it
//! sees the change at once), or, when none answers, on the store directly. Both return the
//! same wire shapes, so what is printed does not depend on the path taken.

use std::sync::Arc;

use switchyard_admin::AdminClient;
use switchyard_admin::wire;
use switchyard_admin::wire::AccountAction;

use super::CommandError;
use super::{admin_socket, state_dir};
use crate::api::view;
use crate::base::clock;
use crate::config::Config;
use crate::fleet::{Fleet, FleetError};
use crate::keys::KeyRing;
use crate::store::{Store, StoreError};

/// What a management command does to the store when no daemon answers: only read it (the file
/// is opened read-only and never rewritten), or change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    Write,
}

/// Where management commands send their work.
pub(super) enum Backend {
    Daemon(AdminClient),
    Direct {
        store: Store,
        fleet: Fleet,
        keys: KeyRing,
    },
}

impl Backend {
    pub(super) async fn connect(config: &Config, access: Access) -> Result<Backend, CommandError> {
        let socket = admin_socket(config);
        if let Ok(client) = AdminClient::connect(&socket).await {
            return Ok(Backend::Daemon(client));
        }
        let dir = state_dir(config);
        let opened = match access {
            Access::Read => Store::open_read_only(&dir),
            Access::Write => Store::open(&dir),
        };
        let store = opened.map_err(|e| match e {
            StoreError::Locked { path } => CommandError::LockedWithoutDaemon { path, socket },
            other => other.into(),
        })?;
        let clock = clock::system();
        let fleet = Fleet::load(store.clone(), Arc::clone(&clock))?;
        let keys = KeyRing::load(store.clone(), clock)?;
        Ok(Backend::Direct { store, fleet, keys })
    }

    pub(super) async fn close(self) -> Result<(), CommandError> {
        if let Backend::Direct { store, .. } = self {
            store.close().await?;
        }
        Ok(())
    }

    pub(super) async fn list_accounts(&self) -> Result<Vec<wire::Account>, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.accounts().await?),
            Backend::Direct { fleet, store, .. } => {
                // The error rates a daemon would show, from the stored records.
                let now = clock::system().now_ms();
                let from =
                    now.saturating_sub(60 * 60_000 + crate::telemetry::report::LONGEST_REQUEST_MS);
                let records: Vec<crate::telemetry::records::RequestRecord> = store
                    .requests_since(from)?
                    .into_iter()
                    .filter_map(|(k, row)| {
                        crate::telemetry::records::RequestRecord::from_row(k, row).ok()
                    })
                    .collect();
                let windows = crate::telemetry::windows::of_records(&records, now);
                Ok(view::accounts_with_rates(&fleet.list(), &windows))
            }
        }
    }

    /// One account by its id, chatgpt_account_id, email or label.
    pub(super) async fn get_account(&self, selector: &str) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.account(selector).await?),
            Backend::Direct { fleet, .. } => {
                let id = fleet.resolve(selector)?;
                Ok(view::account(
                    &fleet.get(&id).ok_or(FleetError::NotFound(id))?,
                ))
            }
        }
    }

    pub(super) async fn import_account(
        &self,
        config: &Config,
        raw: &[u8],
    ) -> Result<wire::ImportedAccount, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.import_account(raw).await?),
            Backend::Direct { fleet, .. } => {
                let upstream = upstream_of(config)?;
                Ok(view::imported(&fleet.import_auth(raw, &upstream).await?))
            }
        }
    }

    pub(super) async fn set_enabled(
        &self,
        id: &str,
        enabled: bool,
    ) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => {
                let action = match enabled {
                    true => AccountAction::Enable,
                    false => AccountAction::Disable,
                };
                Ok(c.account_action(id, action).await?)
            }
            Backend::Direct { fleet, .. } => {
                Ok(view::account(&fleet.set_enabled(id, enabled).await?))
            }
        }
    }

    pub(super) async fn remove_account(&self, id: &str) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.remove_account(id).await?),
            Backend::Direct { fleet, .. } => Ok(view::account(&fleet.remove(id).await?)),
        }
    }

    pub(super) async fn set_account(
        &self,
        id: &str,
        patch: wire::AccountPatch,
    ) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.update_account(id, &patch).await?),
            Backend::Direct { fleet, .. } => Ok(view::account(
                &fleet.set_account(id, view::account_change(patch)).await?,
            )),
        }
    }

    /// Refreshes an account's tokens now (through the daemon, or with an upstream client made
    /// from the config).
    pub(super) async fn refresh_account(
        &self,
        config: &Config,
        id: &str,
    ) -> Result<wire::Account, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.account_action(id, AccountAction::Refresh).await?),
            Backend::Direct { fleet, .. } => {
                let upstream = upstream_of(config)?;
                Ok(view::account(&fleet.refresh_account(id, &upstream).await?))
            }
        }
    }

    pub(super) async fn export_account(
        &self,
        id: &str,
        keep: bool,
    ) -> Result<wire::ExportedAccount, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.export_account(id, keep).await?),
            Backend::Direct { fleet, .. } => Ok(view::exported(&fleet.export(id, keep).await?)),
        }
    }

    pub(super) async fn create_key(
        &self,
        name: &str,
        policy: wire::KeyPolicyPatch,
    ) -> Result<wire::CreatedKey, CommandError> {
        match self {
            Backend::Daemon(c) => {
                let key = wire::CreateKey {
                    name: name.to_string(),
                    policy,
                };
                Ok(c.create_key(&key).await?)
            }
            Backend::Direct { keys, .. } => Ok(view::created_key(
                &keys.create(name, &view::policy_patch(policy)).await?,
            )),
        }
    }

    pub(super) async fn update_key(
        &self,
        id: &str,
        patch: wire::KeyPolicyPatch,
    ) -> Result<wire::Key, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.update_key(id, &patch).await?),
            Backend::Direct { keys, .. } => Ok(view::key(
                &keys.update(id, &view::policy_patch(patch)).await?,
            )),
        }
    }

    pub(super) async fn show_key(&self, id: &str) -> Result<wire::Key, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.key(id).await?),
            Backend::Direct { keys, .. } => Ok(view::key(&keys.resolve(id)?)),
        }
    }

    /// The usage buckets of the hours starting in `[from, to)` (unix seconds).
    pub(super) async fn usage(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<wire::UsageBucket>, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.usage(from, to).await?),
            Backend::Direct { store, keys, .. } => {
                let names = keys.names();
                Ok(store
                    .usage_between(from, to)?
                    .into_iter()
                    .map(|r| view::usage_bucket(r, &names))
                    .collect())
            }
        }
    }

    pub(super) async fn report(
        &self,
        windows: Vec<u64>,
        slow_ms: u64,
    ) -> Result<switchyard_admin::report::Report, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.report(&windows, Some(slow_ms)).await?),
            Backend::Direct { store, fleet, .. } => {
                let names = crate::telemetry::report::names(&fleet.list());
                let scope = crate::telemetry::report::Scope {
                    now_ms: clock::system().now_ms(),
                    windows,
                    slow_ms,
                };
                Ok(crate::telemetry::report::from_store(
                    store,
                    &[],
                    &scope,
                    &names,
                )?)
            }
        }
    }

    pub(super) async fn list_keys(&self) -> Result<Vec<wire::Key>, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.keys().await?),
            Backend::Direct { keys, .. } => Ok(view::keys(&keys.list())),
        }
    }

    pub(super) async fn revoke_key(&self, id: &str) -> Result<wire::Key, CommandError> {
        match self {
            Backend::Daemon(c) => Ok(c.revoke_key(id).await?),
            Backend::Direct { keys, .. } => Ok(view::key(&keys.revoke(id).await?)),
        }
    }
}

/// An upstream client made from the config, for work done without a daemon.
fn upstream_of(config: &Config) -> Result<crate::upstream::Upstream, CommandError> {
    crate::upstream::install_crypto_provider();
    crate::upstream::Upstream::new(&config.upstream).map_err(CommandError::Usage)
}
