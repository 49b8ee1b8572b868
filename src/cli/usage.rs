//! `switchyard usage`: the usage buckets of a period, grouped, priced and printed
//! ([`super::usage_report`]).

use super::CommandError;
use super::args::UsageArgs;
use super::backend::{Access, Backend};
use super::key::parse_time;
use crate::base::clock;
use crate::config::Config;

pub(super) async fn usage(config: &Config, args: UsageArgs) -> Result<(), CommandError> {
    let backend = Backend::connect(config, Access::Read).await?;
    let result = usage_with(&backend, config, args).await;
    backend.close().await?;
    result
}

pub(super) async fn usage_with(
    backend: &Backend,
    config: &Config,
    args: UsageArgs,
) -> Result<(), CommandError> {
    use super::usage_report as report;
    let by = args
        .by
        .iter()
        .map(|g| report::Group::parse(g))
        .collect::<Result<Vec<_>, String>>()
        .map_err(CommandError::Usage)?;
    let now = clock::system().now_secs();
    let (from, to) = match (&args.from, &args.to) {
        (Some(f), Some(t)) => {
            let bad = |what: &str, v: &str| {
                CommandError::Usage(format!(
                    "--{what} `{v}` is not a date (2026-11-01) or an RFC 3339 time"
                ))
            };
            let from = parse_time(f).ok_or_else(|| bad("from", f))? / 1000;
            // A bare date means that whole day.
            let to = match clock::parse_rfc3339_ms(t) {
                Some(ms) => ms / 1000,
                None => parse_time(t).ok_or_else(|| bad("to", t))? / 1000 + 86_400,
            };
            if to <= from {
                return Err(CommandError::Usage("--to must be after --from".into()));
            }
            (from, to)
        }
        _ => {
            let since = args
                .since
                .unwrap_or(std::time::Duration::from_secs(7 * 86_400));
            (now.saturating_sub(since.as_secs()), now + 3600)
        }
    };
    // Hours are whole: the one `from` falls in counts.
    let mut buckets = backend.usage(from - from % 3600, to).await?;
    if let Some(k) = &args.key {
        // The key ring's own resolution (id or name; an ambiguous name lists the ids).
        let id = backend.show_key(k).await?.id;
        buckets.retain(|b| b.key_id == id);
    }
    let accounts: std::collections::BTreeMap<String, String> = backend
        .list_accounts()
        .await?
        .into_iter()
        .map(|a| (a.chatgpt_account_id, a.email.unwrap_or(a.label)))
        .collect();
    let prices = config
        .pricing
        .iter()
        .map(|(m, p)| {
            (
                m.clone(),
                report::Price {
                    input: p.input,
                    cached_input: p.cached_input,
                    output: p.output,
                },
            )
        })
        .collect();
    let r = report::report(&buckets, &by, &prices, &accounts);
    let text = match args.format.as_str() {
        "csv" => report::render_csv(&r),
        "json" => report::render_json(&r),
        _ => report::render_table(&r),
    };
    print!("{text}");
    Ok(())
}
