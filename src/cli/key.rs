//! `switchyard key …`: create, update, show, list, revoke; the policy flags as a change.

use switchyard_admin::wire;

use super::CommandError;
use super::args::{KeyCommand, PolicyArgs, Setting};
use super::backend::{Access, Backend};
use super::table::{table, to_json};
use crate::base::clock;
use crate::config::Config;

pub(super) async fn key(config: &Config, cmd: KeyCommand) -> Result<(), CommandError> {
    let access = match cmd {
        KeyCommand::List(_) | KeyCommand::Show { .. } => Access::Read,
        _ => Access::Write,
    };
    let backend = Backend::connect(config, access).await?;
    let result = key_with(&backend, cmd).await;
    backend.close().await?;
    result
}

pub(super) async fn key_with(backend: &Backend, cmd: KeyCommand) -> Result<(), CommandError> {
    match cmd {
        KeyCommand::Create { name, policy } => {
            let created = backend.create_key(&name, policy_patch(&policy)?).await?;
            eprintln!(
                "created key {} ({}); this is the only time it is shown:",
                created.info.id, created.info.name
            );
            println!("{}", created.key);
        }
        KeyCommand::Update { id, policy } => {
            let patch = policy_patch(&policy)?;
            if patch.is_empty() {
                return Err(CommandError::Usage(
                    "nothing to change: give a policy flag (see `switchyard key update --help`)"
                        .into(),
                ));
            }
            let k = backend.update_key(&id, patch).await?;
            print!("{}", key_detail(&k));
        }
        KeyCommand::Show { id, list } => {
            let k = backend.show_key(&id).await?;
            if list.json {
                println!("{}", to_json(&k));
            } else {
                print!("{}", key_detail(&k));
            }
        }
        KeyCommand::List(args) => {
            let keys = backend.list_keys().await?;
            if args.json {
                println!("{}", to_json(&keys));
            } else {
                print!("{}", key_table(&keys));
            }
        }
        KeyCommand::Revoke { id } => {
            let k = backend.revoke_key(&id).await?;
            println!("revoked key {} ({})", k.id, k.name);
        }
    }
    Ok(())
}

/// The policy flags as a change: `none` and `--clear-…` remove a limit; a duration for
/// `--expires` counts from now.
pub(super) fn policy_patch(p: &PolicyArgs) -> Result<wire::KeyPolicyPatch, CommandError> {
    fn num<T: TryFrom<u64>>(
        name: &str,
        v: &Option<Setting<u64>>,
        clear: bool,
    ) -> Result<Option<Option<T>>, CommandError> {
        match (v, clear) {
            (_, true) | (Some(Setting::Clear), _) => Ok(Some(None)),
            (Some(Setting::Set(n)), _) => T::try_from(*n)
                .map(|n| Some(Some(n)))
                .map_err(|_| CommandError::Usage(format!("--{name} {n} is too large"))),
            (None, false) => Ok(None),
        }
    }
    let models = match (&p.models, p.clear_models) {
        (_, true) | (Some(Setting::Clear), _) => Some(Vec::new()),
        (Some(Setting::Set(list)), _) => Some(
            list.split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect(),
        ),
        (None, false) => None,
    };
    let tiers = match (&p.tiers, p.clear_tiers) {
        (_, true) | (Some(Setting::Clear), _) => Some(Vec::new()),
        (Some(Setting::Set(list)), _) => Some(
            list.split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect(),
        ),
        (None, false) => None,
    };
    let expires_at = match (&p.expires, p.clear_expires) {
        (_, true) | (Some(Setting::Clear), _) => Some(None),
        (Some(Setting::Set(t)), _) => Some(Some(expiry(t)?)),
        (None, false) => None,
    };
    let note = match (&p.note, p.clear_note) {
        (_, true) | (Some(Setting::Clear), _) => Some(None),
        (Some(Setting::Set(t)), _) => Some(Some(t.clone())),
        (None, false) => None,
    };
    Ok(wire::KeyPolicyPatch {
        models,
        tiers,
        max_concurrency: num(
            "max-concurrency",
            &p.max_concurrency,
            p.clear_max_concurrency,
        )?,
        rpm: num("rpm", &p.rpm, p.clear_rpm)?,
        tokens_per_5h: num("tokens-per-5h", &p.tokens_per_5h, p.clear_tokens_per_5h)?,
        tokens_per_day: num("tokens-per-day", &p.tokens_per_day, p.clear_tokens_per_day)?,
        tokens_per_week: num(
            "tokens-per-week",
            &p.tokens_per_week,
            p.clear_tokens_per_week,
        )?,
        expires_at,
        note,
    })
}

/// `--expires`: a date (00:00 UTC that day), an RFC 3339 time, or a duration from now.
pub(super) fn expiry(t: &str) -> Result<String, CommandError> {
    if let Some(ms) = parse_time(t) {
        return Ok(clock::rfc3339(ms / 1000));
    }
    match humantime::parse_duration(t) {
        Ok(d) => Ok(clock::rfc3339(clock::system().now_secs() + d.as_secs())),
        Err(_) => Err(CommandError::Usage(format!(
            "--expires `{t}` is not a date (2027-01-31), an RFC 3339 time or a duration (30d)"
        ))),
    }
}

/// YYYY-MM-DD (00:00 UTC) or RFC 3339, as unix ms.
pub(super) fn parse_time(t: &str) -> Option<u64> {
    clock::parse_rfc3339_ms(t).or_else(|| clock::parse_rfc3339_ms(&format!("{t}T00:00:00Z")))
}

/// One key with its policy, a line per setting.
pub(super) fn key_detail(k: &wire::Key) -> String {
    let p = &k.policy;
    let num = |v: Option<u64>| v.map_or_else(|| "none".to_string(), |n| n.to_string());
    let mut out = format!(
        "{} {} ({}, {}…, created {})\n",
        k.id,
        k.name,
        if k.enabled { "active" } else { "revoked" },
        k.prefix,
        k.created_at
    );
    let lines = [
        (
            "models",
            if p.models.is_empty() {
                "any".to_string()
            } else {
                p.models.join(", ")
            },
        ),
        (
            "service tiers",
            if p.tiers.is_empty() {
                "any".to_string()
            } else {
                p.tiers.join(", ")
            },
        ),
        ("max concurrency", num(p.max_concurrency.map(u64::from))),
        ("rpm", num(p.rpm.map(u64::from))),
        ("tokens per 5h", num(p.tokens_per_5h)),
        ("tokens per day", num(p.tokens_per_day)),
        ("tokens per week", num(p.tokens_per_week)),
        (
            "expires",
            p.expires_at.clone().unwrap_or_else(|| "never".into()),
        ),
        ("note", p.note.clone().unwrap_or_default()),
    ];
    for (name, value) in lines {
        out.push_str(&format!("  {name:<16} {value}\n"));
    }
    out
}

/// `2M`, `300k` when that is exact, else the number.
pub(super) fn exact_short(n: u64) -> String {
    match n {
        0 => "0".into(),
        n if n.is_multiple_of(1_000_000) => format!("{}M", n / 1_000_000),
        n if n.is_multiple_of(1_000) => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// A key's limits in a few words, for the key table.
pub(super) fn limits_summary(p: &wire::KeyPolicy) -> String {
    let mut parts = Vec::new();
    if !p.models.is_empty() {
        parts.push(p.models.join(","));
    }
    if !p.tiers.is_empty() {
        parts.push(format!("tiers {}", p.tiers.join(",")));
    }
    if let Some(n) = p.max_concurrency {
        parts.push(format!("{n} at once"));
    }
    if let Some(n) = p.rpm {
        parts.push(format!("{n} rpm"));
    }
    for (w, v) in [
        ("5h", p.tokens_per_5h),
        ("day", p.tokens_per_day),
        ("week", p.tokens_per_week),
    ] {
        if let Some(n) = v {
            parts.push(format!("{} tok/{w}", exact_short(n)));
        }
    }
    if let Some(t) = &p.expires_at {
        parts.push(format!("expires {t}"));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" · ")
    }
}

pub(super) fn key_table(keys: &[wire::Key]) -> String {
    if keys.is_empty() {
        return "no keys (create one with `switchyard key create NAME`)\n".into();
    }
    table(
        &["ID", "NAME", "PREFIX", "STATUS", "CREATED", "LIMITS"],
        keys.iter()
            .map(|k| {
                vec![
                    k.id.clone(),
                    k.name.clone(),
                    format!("{}…", k.prefix),
                    if k.enabled {
                        "active".into()
                    } else {
                        "revoked".into()
                    },
                    k.created_at.clone(),
                    limits_summary(&k.policy),
                ]
            })
            .collect(),
    )
}
