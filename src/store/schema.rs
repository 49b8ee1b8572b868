//! Every redb table, as constants. Keys are ids (text) or time-ordered integers; values are
//! always bytes written by [`super::codec`], so the value format changes in one place.

use redb::TableDefinition;

/// The schema this binary writes. A file with a larger number was written by a newer
/// switchyard and is refused; a smaller one is migrated at open (`super::migrate`).
/// 1: 0.1.0. 2: 0.2.0, whose values carry their own versions. 3: 0.3.0, with key policies
/// and hourly usage buckets. 4: 0.4.0, with accounts' egress proxies, unproven accounts and
/// request records with their terminal source.
pub const SCHEMA_VERSION: u64 = 4;

/// `schema_version` (u64 little-endian, never codec-encoded so any future binary can read
/// it) and `key_check` (a value sealed with `secret.key`, to detect a wrong key at open).
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub const META_SCHEMA_VERSION: &str = "schema_version";
pub const META_KEY_CHECK: &str = "key_check";

/// Account id -> `AccountRecord` (no secrets).
pub const ACCOUNTS: TableDefinition<&str, &[u8]> = TableDefinition::new("accounts");
/// Account id -> sealed `AccountSecrets`.
pub const ACCOUNT_SECRETS: TableDefinition<&str, &[u8]> = TableDefinition::new("account_secrets");
/// Account id -> sealed `AccountProxyRecord` (its own egress proxy).
pub const ACCOUNT_PROXIES: TableDefinition<&str, &[u8]> = TableDefinition::new("account_proxies");
/// Account id -> health state, written through on every transition.
pub const ACCOUNT_HEALTH: TableDefinition<&str, &[u8]> = TableDefinition::new("account_health");
/// Key id -> `ClientKeyRecord` (the SHA-256 of the key, never the key).
pub const CLIENT_KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("client_keys");
/// Setting name -> value.
pub const SETTINGS: TableDefinition<&str, &[u8]> = TableDefinition::new("settings");
/// Time-ordered request id -> request record.
pub const REQUESTS: TableDefinition<u64, &[u8]> = TableDefinition::new("requests");
/// `HOUR/KEY_ID/ACCOUNT/MODEL` (the hour's start in unix seconds, 10 digits, so that keys sort
/// by time) -> that hour's usage totals.
pub const USAGE_HOURLY: TableDefinition<&str, &[u8]> = TableDefinition::new("usage_hourly");
/// TTL-map name -> its snapshot (session affinity, response ownership).
pub const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
/// Redeem request id -> `CreditSpendRecord`: each reset-credit spend, written before its call.
pub const CREDIT_SPENDS: TableDefinition<&str, &[u8]> = TableDefinition::new("credit_spends");

/// A table the writer task can be asked to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Meta,
    Accounts,
    AccountSecrets,
    AccountProxies,
    AccountHealth,
    ClientKeys,
    Settings,
    Requests,
    UsageHourly,
    Snapshots,
    CreditSpends,
}

impl Table {
    /// The definition of a table keyed by text; `None` for [`Table::Requests`].
    pub(crate) fn text_keyed(
        self,
    ) -> Option<TableDefinition<'static, &'static str, &'static [u8]>> {
        Some(match self {
            Table::Meta => META,
            Table::Accounts => ACCOUNTS,
            Table::AccountSecrets => ACCOUNT_SECRETS,
            Table::AccountProxies => ACCOUNT_PROXIES,
            Table::AccountHealth => ACCOUNT_HEALTH,
            Table::ClientKeys => CLIENT_KEYS,
            Table::Settings => SETTINGS,
            Table::UsageHourly => USAGE_HOURLY,
            Table::Snapshots => SNAPSHOTS,
            Table::CreditSpends => CREDIT_SPENDS,
            Table::Requests => return None,
        })
    }

    /// Every table, so a new file gets them all at creation.
    pub(crate) const ALL: [Table; 11] = [
        Table::Meta,
        Table::Accounts,
        Table::AccountSecrets,
        Table::AccountProxies,
        Table::AccountHealth,
        Table::ClientKeys,
        Table::Settings,
        Table::Requests,
        Table::UsageHourly,
        Table::Snapshots,
        Table::CreditSpends,
    ];
}
