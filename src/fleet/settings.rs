//! Scheduling settings: from the config's `[scheduling]`, overridden live by
//! the admin API's `PUT settings` (persisted in redb as a patch over the config, so a value changed
//! by an operator survives a restart and `null` hands a key back to the config).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::duration::text as duration;
use crate::store::records::SettingsRecord;

/// How the candidates of a request are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Most headroom in the 5-hour window, then the weekly one, then the soonest reset.
    #[default]
    QuotaAware,
    RoundRobin,
    /// Lowest in-flight / limit first.
    LeastLoaded,
    /// Lowest `priority` first, filling one account before the next.
    FillFirst,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::QuotaAware => "quota_aware",
            Strategy::RoundRobin => "round_robin",
            Strategy::LeastLoaded => "least_loaded",
            Strategy::FillFirst => "fill_first",
        }
    }

    /// The strategy with this name (as the config and the store write it).
    pub fn from_name(name: &str) -> Option<Strategy> {
        [
            Strategy::QuotaAware,
            Strategy::RoundRobin,
            Strategy::LeastLoaded,
            Strategy::FillFirst,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

/// The effective scheduling settings (config `[scheduling]`, and the admin API's `GET settings`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub strategy: Strategy,
    /// Concurrent requests per account (the adaptive limit's maximum).
    #[serde(deserialize_with = "positive_u32")]
    pub max_concurrency: u32,
    /// How long a session waits for its bound account's slot before rebinding.
    #[serde(with = "duration")]
    pub sticky_wait: Duration,
    /// Sessions that may wait on one account at a time.
    pub sticky_max_waiting: usize,
    /// How long a request waits for any slot in the pool.
    #[serde(with = "duration")]
    pub queue_wait: Duration,
    /// Requests that may wait for the pool at a time.
    pub queue_max_waiting: usize,
    /// Accounts whose 5-hour or weekly window is used beyond this are skipped while others
    /// have headroom.
    pub quota_ceiling_percent: f64,
    /// How often each account's `wham/usage` is polled (jittered).
    #[serde(with = "duration")]
    pub usage_poll_interval: Duration,
    /// A session not seen for this long forgets its account.
    #[serde(with = "duration")]
    pub affinity_idle_ttl: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            strategy: Strategy::QuotaAware,
            max_concurrency: 3,
            sticky_wait: Duration::from_secs(30),
            sticky_max_waiting: 3,
            queue_wait: Duration::from_secs(30),
            queue_max_waiting: 100,
            quota_ceiling_percent: 99.0,
            usage_poll_interval: Duration::from_secs(600),
            affinity_idle_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

fn positive_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if v == 0 {
        return Err(serde::de::Error::custom("must be at least 1"));
    }
    Ok(v)
}

/// A partial change of settings; `null` (or absence) leaves a key as the config has it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    pub strategy: Option<Strategy>,
    pub max_concurrency: Option<u32>,
    pub sticky_wait: Option<String>,
    pub sticky_max_waiting: Option<usize>,
    pub queue_wait: Option<String>,
    pub queue_max_waiting: Option<usize>,
    pub quota_ceiling_percent: Option<f64>,
    pub usage_poll_interval: Option<String>,
    pub affinity_idle_ttl: Option<String>,
}

fn dur(key: &str, v: &Option<String>) -> Result<Option<Duration>, String> {
    v.as_deref()
        .map(|s| {
            humantime::parse_duration(s)
                .map_err(|e| format!("`{key}`: `{s}` is not a duration like \"30s\": {e}"))
        })
        .transpose()
}

impl SettingsPatch {
    /// The stored shape.
    pub fn to_record(&self) -> SettingsRecord {
        SettingsRecord {
            strategy: self.strategy.map(|s| s.as_str().into()),
            max_concurrency: self.max_concurrency,
            sticky_wait: self.sticky_wait.clone(),
            sticky_max_waiting: self.sticky_max_waiting.map(|n| n as u64),
            queue_wait: self.queue_wait.clone(),
            queue_max_waiting: self.queue_max_waiting.map(|n| n as u64),
            quota_ceiling_percent: self.quota_ceiling_percent,
            usage_poll_interval: self.usage_poll_interval.clone(),
            affinity_idle_ttl: self.affinity_idle_ttl.clone(),
        }
    }

    /// Reads the stored shape; a strategy this binary does not know is an error.
    pub fn from_record(r: SettingsRecord) -> Result<SettingsPatch, String> {
        let count = |n: Option<u64>| n.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        Ok(SettingsPatch {
            strategy: r
                .strategy
                .map(|n| Strategy::from_name(&n).ok_or_else(|| format!("strategy `{n}`")))
                .transpose()?,
            max_concurrency: r.max_concurrency,
            sticky_wait: r.sticky_wait,
            sticky_max_waiting: count(r.sticky_max_waiting),
            queue_wait: r.queue_wait,
            queue_max_waiting: count(r.queue_max_waiting),
            quota_ceiling_percent: r.quota_ceiling_percent,
            usage_poll_interval: r.usage_poll_interval,
            affinity_idle_ttl: r.affinity_idle_ttl,
        })
    }

    /// Checks the values without applying them.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_concurrency == Some(0) {
            return Err("`max_concurrency` must be at least 1".into());
        }
        if let Some(p) = self.quota_ceiling_percent
            && !(0.0..=100.0).contains(&p)
        {
            return Err("`quota_ceiling_percent` must be between 0 and 100".into());
        }
        dur("sticky_wait", &self.sticky_wait)?;
        dur("queue_wait", &self.queue_wait)?;
        let poll = dur("usage_poll_interval", &self.usage_poll_interval)?;
        if poll.is_some_and(|p| p < Duration::from_secs(10)) {
            return Err("`usage_poll_interval` must be at least 10s".into());
        }
        if dur("affinity_idle_ttl", &self.affinity_idle_ttl)?.is_some_and(|d| d.is_zero()) {
            return Err("`affinity_idle_ttl` must be more than 0s".into());
        }
        Ok(())
    }

    /// Folds a later patch into this one (its set keys win).
    pub fn merge(&mut self, later: SettingsPatch) {
        macro_rules! take {
            ($($f:ident),*) => { $( if later.$f.is_some() { self.$f = later.$f; } )* };
        }
        take!(
            strategy,
            max_concurrency,
            sticky_wait,
            sticky_max_waiting,
            queue_wait,
            queue_max_waiting,
            quota_ceiling_percent,
            usage_poll_interval,
            affinity_idle_ttl
        );
    }

    /// `base` with this patch applied (the patch must have been validated).
    pub fn apply(&self, base: &Settings) -> Settings {
        let mut s = base.clone();
        if let Some(v) = self.strategy {
            s.strategy = v;
        }
        if let Some(v) = self.max_concurrency {
            s.max_concurrency = v.max(1);
        }
        if let Some(v) = self.sticky_max_waiting {
            s.sticky_max_waiting = v;
        }
        if let Some(v) = self.queue_max_waiting {
            s.queue_max_waiting = v;
        }
        if let Some(v) = self.quota_ceiling_percent {
            s.quota_ceiling_percent = v;
        }
        if let Ok(Some(v)) = dur("sticky_wait", &self.sticky_wait) {
            s.sticky_wait = v;
        }
        if let Ok(Some(v)) = dur("queue_wait", &self.queue_wait) {
            s.queue_wait = v;
        }
        if let Ok(Some(v)) = dur("usage_poll_interval", &self.usage_poll_interval) {
            s.usage_poll_interval = v;
        }
        if let Ok(Some(v)) = dur("affinity_idle_ttl", &self.affinity_idle_ttl) {
            s.affinity_idle_ttl = v;
        }
        s
    }
}

/// A patch as the admin API receives it: JSON, where `null` means "back to the config".
pub fn patch_from_json(v: &serde_json::Value) -> Result<(SettingsPatch, Vec<String>), String> {
    let obj = v
        .as_object()
        .ok_or("the settings body must be a JSON object")?;
    let resets: Vec<String> = obj
        .iter()
        .filter(|(_, v)| v.is_null())
        .map(|(k, _)| k.clone())
        .collect();
    // Durations may be given as strings ("30s") or as seconds.
    let mut normalized = serde_json::Map::new();
    for (k, val) in obj {
        let val = match (k.as_str(), val) {
            (
                "sticky_wait" | "queue_wait" | "usage_poll_interval" | "affinity_idle_ttl",
                serde_json::Value::Number(n),
            ) => serde_json::Value::String(format!("{}s", n.as_u64().unwrap_or(0))),
            _ => val.clone(),
        };
        normalized.insert(k.clone(), val);
    }
    let patch: SettingsPatch =
        serde_json::from_value(serde_json::Value::Object(normalized)).map_err(|e| e.to_string())?;
    patch.validate()?;
    Ok((patch, resets))
}

impl SettingsPatch {
    /// Clears the keys named in `resets` (they go back to the config's values).
    pub fn reset(&mut self, resets: &[String]) {
        for k in resets {
            match k.as_str() {
                "strategy" => self.strategy = None,
                "max_concurrency" => self.max_concurrency = None,
                "sticky_wait" => self.sticky_wait = None,
                "sticky_max_waiting" => self.sticky_max_waiting = None,
                "queue_wait" => self.queue_wait = None,
                "queue_max_waiting" => self.queue_max_waiting = None,
                "quota_ceiling_percent" => self.quota_ceiling_percent = None,
                "usage_poll_interval" => self.usage_poll_interval = None,
                "affinity_idle_ttl" => self.affinity_idle_ttl = None,
                _ => {}
            }
        }
    }
}

impl super::Fleet {
    /// Applies an operator's change of settings live and persists it.
    pub async fn update_settings(
        &self,
        patch: SettingsPatch,
        resets: &[String],
    ) -> Result<Settings, crate::store::StoreError> {
        let (stored, effective, old_max) = {
            let mut st = self.settings.write().unwrap_or_else(|e| e.into_inner());
            let old_max = st.effective.max_concurrency;
            st.patch.merge(patch);
            st.patch.reset(resets);
            st.effective = st.patch.apply(&st.base);
            (st.patch.clone(), st.effective.clone(), old_max)
        };
        self.store
            .put_settings(super::SETTINGS_KEY, &stored.to_record())
            .await?;
        self.apply_max_concurrency(old_max, effective.max_concurrency);
        let mut cfg = self.affinity.sessions.config();
        cfg.idle = Some(effective.affinity_idle_ttl);
        self.affinity.sessions.set_config(cfg);
        tracing::info!(
            strategy = effective.strategy.as_str(),
            "scheduling settings changed"
        );
        Ok(effective)
    }

    /// Replaces the settings the operator's stored patch applies over (the config file's
    /// `[scheduling]`, on a reload); returns the effective settings. Requests already planned
    /// keep their plan; the next one is planned with these.
    pub fn set_base(&self, base: Settings) -> Settings {
        let (effective, old_max) = {
            let mut st = self.settings.write().unwrap_or_else(|e| e.into_inner());
            let old_max = st.effective.max_concurrency;
            st.base = base;
            st.effective = st.patch.apply(&st.base);
            (st.effective.clone(), old_max)
        };
        self.apply_max_concurrency(old_max, effective.max_concurrency);
        let mut cfg = self.affinity.sessions.config();
        cfg.idle = Some(effective.affinity_idle_ttl);
        self.affinity.sessions.set_config(cfg);
        effective
    }

    /// Moves the adaptive limits of accounts without their own cap to a new pool maximum.
    fn apply_max_concurrency(&self, old_max: u32, new_max: u32) {
        if old_max == new_max {
            return;
        }
        let ids: Vec<String> = {
            let mut inner = self.write();
            let mut ids = Vec::new();
            for mut e in inner.accounts.values_mut() {
                if e.record.max_concurrency.is_none() {
                    // An account at the old maximum moves to the new one; one that was
                    // throttled keeps its limit, capped by the new maximum.
                    if e.limit >= f64::from(old_max) {
                        e.limit = f64::from(new_max);
                    } else {
                        e.limit = e.limit.min(f64::from(new_max));
                    }
                    ids.push(e.record.id.clone());
                }
            }
            ids
        };
        for id in ids {
            self.hand_off(&id);
        }
    }

    /// The admin API's `PUT accounts/{id}` and `account set`: the account's label, its priority,
    /// its own concurrency cap (`Some(None)` removes the cap) and its egress proxy.
    pub async fn set_account(
        &self,
        selector: &str,
        change: AccountChange,
    ) -> Result<super::AccountView, super::FleetError> {
        let AccountChange {
            label,
            priority,
            max_concurrency,
            proxy,
        } = change;
        let proxy = match proxy {
            None => None,
            Some(None) => Some(None),
            Some(Some(url)) => Some(Some(std::sync::Arc::new(
                crate::upstream::egress::ProxyUrl::parse(&url)
                    .map_err(|e| super::FleetError::Invalid(format!("proxy: {e}")))?,
            ))),
        };
        if let Some(l) = &label
            && (l.trim().is_empty() || l.chars().count() > 64 || l.chars().any(char::is_control))
        {
            return Err(super::FleetError::Invalid(format!(
                "label `{l}`: use 1 to 64 printable characters"
            )));
        }
        let pool_max = self.settings().max_concurrency;
        let (id, record) = self.update_entry(selector, |e, now_ms| {
            if let Some(l) = label {
                e.record.label = l.trim().to_string();
            }
            if let Some(p) = priority {
                e.record.priority = p;
            }
            if let Some(m) = max_concurrency {
                e.record.max_concurrency = m.map(|v| v.max(1));
                e.limit = f64::from(e.record.max_concurrency.unwrap_or(pool_max));
            }
            e.record.updated_at = now_ms / 1000;
            e.record.clone()
        })?;
        let mut writes = vec![crate::store::Store::account_mutation(&record)?];
        if let Some(p) = &proxy {
            let url = p.as_ref().map(|p| p.as_url());
            writes.push(self.store.proxy_mutation(&id, url.as_deref())?);
        }
        self.store.write(writes).await?;
        // The new way out takes effect once it is durable (a failed write changes nothing).
        if let Some(p) = proxy {
            let _ = self.update_entry(&id, |e, _| e.proxy = p);
            tracing::info!(account = %id, proxy = ?self.get(&id).and_then(|v| v.proxy), "account egress proxy set");
        }
        self.hand_off(&id);
        self.get(&id).ok_or(super::FleetError::NotFound(id))
    }
}

/// What `account set` changes; `None` fields stay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountChange {
    pub label: Option<String>,
    pub priority: Option<i32>,
    /// `Some(None)` removes the account's own cap.
    pub max_concurrency: Option<Option<u32>>,
    /// Its own egress proxy URL; `Some(None)` removes it (then `[upstream] proxy`, if any).
    pub proxy: Option<Option<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_patch_applies_over_the_config_and_null_resets() {
        let base = Settings::default();
        let (p, resets) = patch_from_json(
            &json!({"strategy": "round_robin", "queue_wait": "5s", "sticky_wait": 2}),
        )
        .unwrap();
        assert!(resets.is_empty());
        let s = p.apply(&base);
        assert_eq!(s.strategy, Strategy::RoundRobin);
        assert_eq!(s.queue_wait, Duration::from_secs(5));
        assert_eq!(s.sticky_wait, Duration::from_secs(2));
        let mut stored = p;
        let (later, resets) =
            patch_from_json(&json!({"strategy": null, "max_concurrency": 1})).unwrap();
        stored.merge(later);
        stored.reset(&resets);
        let s = stored.apply(&base);
        assert_eq!((s.strategy, s.max_concurrency), (Strategy::QuotaAware, 1));
        assert_eq!(s.queue_wait, Duration::from_secs(5));
    }

    #[test]
    fn bad_patches_are_refused() {
        for bad in [
            json!({"strategy": "random"}),
            json!({"max_concurrency": 0}),
            json!({"queue_wait": "soon"}),
            json!({"quota_ceiling_percent": 150}),
            json!({"nope": 1}),
            json!([1]),
        ] {
            assert!(patch_from_json(&bad).is_err(), "{bad}");
        }
    }
}
