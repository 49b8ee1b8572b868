//! Usage reports: the daemon's hourly usage buckets summed over a period and grouped by the
//! dimensions an operator picks (key, model, account, day, hour), with a cost when prices are
//! known.
//!
//! A [`Report`] holds one [`ReportRow`] per distinct combination of the chosen dimensions that
//! occurs in the buckets, sorted by its values (days and hours chronologically), and the
//! [`Totals`] over every bucket. A bucket's cost comes from its model's [`Price`]; models with
//! no price count for zero and are listed in [`Report::unpriced_models`]. The renderers turn a
//! report into an aligned table for the terminal, CSV, or JSON; every count in them is exact, so
//! they reconcile with the daemon's own figures.

use std::collections::BTreeMap;

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use switchyard_admin::wire::UsageBucket;

/// One dimension a report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// The client key's name.
    Key,
    /// The model asked for.
    Model,
    /// The account that served, by its name when known.
    Account,
    /// The UTC day, `YYYY-MM-DD`.
    Day,
    /// The UTC hour, `YYYY-MM-DDTHH:00Z`.
    Hour,
}

impl Group {
    /// Every dimension, in the order they are listed to the operator.
    pub const ALL: [Group; 5] = [
        Group::Key,
        Group::Model,
        Group::Account,
        Group::Day,
        Group::Hour,
    ];

    /// Parses a dimension's name (`key`, `model`, `account`, `day` or `hour`, any case).
    pub fn parse(s: &str) -> Result<Group, String> {
        let wanted = s.trim();
        Group::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| {
                let valid: Vec<&str> = Group::ALL.iter().map(|g| g.name()).collect();
                format!(
                    "unknown grouping `{wanted}`: expected one of {}",
                    valid.join(", ")
                )
            })
    }

    /// The dimension's name: its CSV column and JSON field.
    pub fn name(self) -> &'static str {
        match self {
            Group::Key => "key",
            Group::Model => "model",
            Group::Account => "account",
            Group::Day => "day",
            Group::Hour => "hour",
        }
    }

    /// The dimension's table header.
    fn header(self) -> &'static str {
        match self {
            Group::Key => "KEY",
            Group::Model => "MODEL",
            Group::Account => "ACCOUNT",
            Group::Day => "DAY",
            Group::Hour => "HOUR",
        }
    }
}

/// A model's price, in USD per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// Uncached input tokens.
    pub input: f64,
    /// Input tokens served from the cache.
    pub cached_input: f64,
    /// Output tokens, reasoning included.
    pub output: f64,
}

impl Price {
    /// What one bucket's tokens cost at this price.
    fn cost(&self, b: &UsageBucket) -> f64 {
        let uncached = b.input_tokens.saturating_sub(b.cached_tokens);
        (uncached as f64 * self.input
            + b.cached_tokens as f64 * self.cached_input
            + b.output_tokens as f64 * self.output)
            / 1e6
    }
}

/// Summed counters of some buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub requests: u64,
    /// Requests whose client got an error.
    pub errors: u64,
    /// Input tokens, cached included.
    pub input_tokens: u64,
    pub cached_tokens: u64,
    /// Output tokens, reasoning included.
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    /// Summed request durations.
    pub duration_ms: u64,
    /// The cost of the priced buckets; `None` when the report has no prices at all.
    pub cost_usd: Option<f64>,
}

impl Totals {
    /// The share of input tokens served from the cache; `None` without input.
    pub fn cache_hit_ratio(&self) -> Option<f64> {
        (self.input_tokens > 0).then(|| self.cached_tokens as f64 / self.input_tokens as f64)
    }

    /// Adds one bucket, and `cost` to the cost when there is one.
    fn add(&mut self, b: &UsageBucket, cost: Option<f64>) {
        self.requests = self.requests.saturating_add(b.requests);
        self.errors = self.errors.saturating_add(b.errors);
        self.input_tokens = self.input_tokens.saturating_add(b.input_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(b.cached_tokens);
        self.output_tokens = self.output_tokens.saturating_add(b.output_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(b.reasoning_tokens);
        self.duration_ms = self.duration_ms.saturating_add(b.duration_ms);
        if let (Some(sum), Some(cost)) = (self.cost_usd.as_mut(), cost) {
            *sum += cost;
        }
    }
}

/// One combination of group values and its totals.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRow {
    /// One value per dimension of [`Report::by`], in order.
    pub group: Vec<String>,
    pub totals: Totals,
}

/// Usage summed and grouped; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The dimensions grouped by, in column order.
    pub by: Vec<Group>,
    /// One row per combination that occurs, sorted by its values.
    pub rows: Vec<ReportRow>,
    /// Every bucket summed.
    pub total: Totals,
    /// Whether any prices were given (and so whether costs are shown).
    pub priced: bool,
    /// Models seen without a price, sorted; their tokens are not in any cost.
    pub unpriced_models: Vec<String>,
}

/// One part of a row's identity; times are numbers so that they sort chronologically.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Time(u64),
    Text(String),
}

/// Sums `buckets` grouped by `by`, costing them with `prices` (by model) and showing accounts
/// by their names in `account_names` (by `chatgpt_account_id`) where known.
///
/// Rows exist only for combinations that occur, so no buckets means no rows; with an empty `by`
/// every bucket falls in one row whose group is empty. Accounts are grouped by id, so two
/// accounts that share a name stay two rows.
pub fn report(
    buckets: &[UsageBucket],
    by: &[Group],
    prices: &BTreeMap<String, Price>,
    account_names: &BTreeMap<String, String>,
) -> Report {
    let priced = !prices.is_empty();
    let zero = Totals {
        cost_usd: priced.then_some(0.0),
        ..Totals::default()
    };
    let mut total = zero.clone();
    let mut groups: BTreeMap<Vec<Part>, Totals> = BTreeMap::new();
    let mut unpriced = std::collections::BTreeSet::new();

    for b in buckets {
        let cost = match prices.get(&b.model) {
            Some(price) => Some(price.cost(b)),
            // Requests that used no tokens (refused ones, some before their model was read)
            // cost nothing, priced or not.
            None if b.input_tokens == 0 && b.output_tokens == 0 => Some(0.0),
            None => {
                unpriced.insert(b.model.clone());
                None
            }
        };
        let identity = by.iter().map(|g| identity(*g, b)).collect();
        groups
            .entry(identity)
            .or_insert_with(|| zero.clone())
            .add(b, cost);
        total.add(b, cost);
    }

    let mut rows: Vec<(Vec<Part>, Vec<Part>, ReportRow)> = groups
        .into_iter()
        .map(|(identity, totals)| {
            let group: Vec<String> = by
                .iter()
                .zip(&identity)
                .map(|(g, part)| display(*g, part, account_names))
                .collect();
            // Sort by what is shown (account names, not ids), times by time, then by identity.
            let order = by
                .iter()
                .zip(&identity)
                .zip(&group)
                .map(|((g, part), shown)| match (g, part) {
                    (Group::Account, _) => Part::Text(shown.clone()),
                    _ => part.clone(),
                })
                .collect();
            (order, identity, ReportRow { group, totals })
        })
        .collect();
    rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));

    Report {
        by: by.to_vec(),
        rows: rows.into_iter().map(|(_, _, row)| row).collect(),
        total,
        priced,
        unpriced_models: unpriced.into_iter().collect(),
    }
}

/// What identifies `b` along `g`.
fn identity(g: Group, b: &UsageBucket) -> Part {
    match g {
        Group::Key => Part::Text(b.key.clone()),
        Group::Model => Part::Text(b.model.clone()),
        Group::Account => Part::Text(b.account.clone()),
        Group::Day => Part::Time(b.hour - b.hour % 86_400),
        Group::Hour => Part::Time(b.hour - b.hour % 3_600),
    }
}

/// How an identity part along `g` is shown.
fn display(g: Group, part: &Part, account_names: &BTreeMap<String, String>) -> String {
    match (g, part) {
        (Group::Day, Part::Time(t)) => format_day(*t),
        (Group::Hour, Part::Time(t)) => format_hour(*t),
        (Group::Account, Part::Text(id)) if id.is_empty() => "(none)".to_owned(),
        (Group::Account, Part::Text(id)) => account_names.get(id).unwrap_or(id).clone(),
        (_, Part::Text(s)) => s.clone(),
        (_, Part::Time(t)) => t.to_string(),
    }
}

/// The proleptic Gregorian `(year, month, day)` of a count of days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let doe = z % 146_097; // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365], from March 1st
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DD` (UTC) of a unix time.
fn format_day(unix: u64) -> String {
    let (y, m, d) = civil_from_days(unix / 86_400);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM-DDTHH:00Z` of a unix time.
fn format_hour(unix: u64) -> String {
    format!("{}T{:02}:00Z", format_day(unix), unix % 86_400 / 3_600)
}

/// The counter columns, after the group columns: table header and CSV/JSON name.
const COUNTERS: [(&str, &str); 6] = [
    ("REQUESTS", "requests"),
    ("ERRORS", "errors"),
    ("INPUT", "input_tokens"),
    ("CACHED", "cached_tokens"),
    ("OUTPUT", "output_tokens"),
    ("REASONING", "reasoning_tokens"),
];

/// The counters in [`COUNTERS`] order.
fn counters(t: &Totals) -> [u64; 6] {
    [
        t.requests,
        t.errors,
        t.input_tokens,
        t.cached_tokens,
        t.output_tokens,
        t.reasoning_tokens,
    ]
}

/// The table's counter, cache-hit and cost cells for `t`.
fn table_cells(t: &Totals, priced: bool) -> Vec<String> {
    let mut cells: Vec<String> = counters(t).iter().map(u64::to_string).collect();
    cells.push(match t.cache_hit_ratio() {
        Some(r) => format!("{:.0}%", r * 100.0),
        None => "–".to_owned(),
    });
    if priced {
        cells.push(dollars(t.cost_usd.unwrap_or(0.0)));
    }
    cells
}

/// An aligned table: the group columns, the counters, the cache hit ratio and (when priced) the
/// Dollars with cents, or with four decimals under a dollar (a few requests cost fractions of
/// a cent).
fn dollars(v: f64) -> String {
    if v != 0.0 && v.abs() < 1.0 {
        format!("${v:.4}")
    } else {
        format!("${v:.2}")
    }
}

/// cost, one line per row and a final `TOTAL` line, then a note on models without a price.
pub fn render_table(report: &Report) -> String {
    if report.rows.is_empty() {
        return "no usage in this period\n".to_owned();
    }
    // With no dimensions the only row is the total, shown under an unnamed label column.
    let labels: Vec<&str> = if report.by.is_empty() {
        vec![""]
    } else {
        report.by.iter().map(|g| g.header()).collect()
    };
    let mut header: Vec<String> = labels.iter().map(|h| (*h).to_owned()).collect();
    header.extend(COUNTERS.iter().map(|(h, _)| (*h).to_owned()));
    header.push("CACHE HIT".to_owned());
    if report.priced {
        header.push("COST USD".to_owned());
    }

    let mut lines = vec![header];
    if !report.by.is_empty() {
        for row in &report.rows {
            let mut cells = row.group.clone();
            cells.extend(table_cells(&row.totals, report.priced));
            lines.push(cells);
        }
    }
    let mut total = vec![String::new(); labels.len()];
    total[0] = "TOTAL".to_owned();
    total.extend(table_cells(&report.total, report.priced));
    lines.push(total);

    let columns = lines[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let mut text = String::new();
        for (c, (cell, width)) in line.iter().zip(&widths).enumerate() {
            if c > 0 {
                text.push_str("  ");
            }
            let pad = " ".repeat(width - cell.chars().count());
            if c < labels.len() {
                text.push_str(cell);
                text.push_str(&pad);
            } else {
                text.push_str(&pad);
                text.push_str(cell);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    if report.priced && !report.unpriced_models.is_empty() {
        out.push_str(&format!(
            "no price for: {} (not in the cost)\n",
            report.unpriced_models.join(", ")
        ));
    }
    out
}

/// Quotes a CSV field when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// CSV with a header line and one line per row (no total line); the cache hit ratio has four
/// decimals (empty without input) and the cost, present when priced, six.
pub fn render_csv(report: &Report) -> String {
    let mut header: Vec<&str> = report.by.iter().map(|g| g.name()).collect();
    header.extend(COUNTERS.iter().map(|(_, name)| *name));
    header.push("cache_hit_ratio");
    if report.priced {
        header.push("cost_usd");
    }
    let mut out = header.join(",");
    out.push('\n');
    for row in &report.rows {
        let mut cells: Vec<String> = row.group.iter().map(|v| csv_field(v)).collect();
        cells.extend(counters(&row.totals).iter().map(u64::to_string));
        cells.push(
            row.totals
                .cache_hit_ratio()
                .map(|r| format!("{r:.4}"))
                .unwrap_or_default(),
        );
        if report.priced {
            cells.push(format!("{:.6}", row.totals.cost_usd.unwrap_or(0.0)));
        }
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// A row's (or the total's) JSON object: its group fields by name, then the counters.
struct JsonTotals<'a> {
    group: Vec<(&'static str, &'a str)>,
    totals: &'a Totals,
}

impl Serialize for JsonTotals<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let t = self.totals;
        let mut map = serializer.serialize_map(None)?;
        for (name, value) in &self.group {
            map.serialize_entry(name, value)?;
        }
        for ((_, name), value) in COUNTERS.iter().zip(counters(t)) {
            map.serialize_entry(name, &value)?;
        }
        map.serialize_entry("duration_ms", &t.duration_ms)?;
        map.serialize_entry("cache_hit_ratio", &t.cache_hit_ratio())?;
        map.serialize_entry("cost_usd", &t.cost_usd)?;
        map.end()
    }
}

/// The whole report as JSON.
#[derive(Serialize)]
struct JsonReport<'a> {
    by: Vec<&'static str>,
    rows: Vec<JsonTotals<'a>>,
    total: JsonTotals<'a>,
    unpriced_models: &'a [String],
}

/// Pretty JSON: `by`, `rows` (each with its group fields by name, the counters, `duration_ms`,
/// `cache_hit_ratio` and `cost_usd`, null when unknown), `total` and `unpriced_models`.
pub fn render_json(report: &Report) -> String {
    let doc = JsonReport {
        by: report.by.iter().map(|g| g.name()).collect(),
        rows: report
            .rows
            .iter()
            .map(|row| JsonTotals {
                group: report
                    .by
                    .iter()
                    .map(|g| g.name())
                    .zip(row.group.iter().map(String::as_str))
                    .collect(),
                totals: &row.totals,
            })
            .collect(),
        total: JsonTotals {
            group: Vec::new(),
            totals: &report.total,
        },
        unpriced_models: &report.unpriced_models,
    };
    // Serializing strings, integers and floats into memory cannot fail.
    let mut json = serde_json::to_string_pretty(&doc).unwrap_or_default();
    json.push('\n');
    json
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// 2024-02-29T10:00:00Z, a leap day.
    const LEAP_DAY_10H: u64 = 1_709_200_800;

    fn bucket(hour: u64, key: &str, model: &str, account: &str, n: u64) -> UsageBucket {
        UsageBucket {
            hour,
            key_id: format!("id-{key}"),
            key: key.to_owned(),
            model: model.to_owned(),
            account: account.to_owned(),
            requests: n,
            errors: n / 2,
            input_tokens: 1_000 * n,
            cached_tokens: 400 * n,
            output_tokens: 100 * n,
            reasoning_tokens: 30 * n,
            duration_ms: 250 * n,
        }
    }

    fn sample() -> Vec<UsageBucket> {
        vec![
            bucket(LEAP_DAY_10H, "alice", "gpt-5", "acct-1", 2),
            bucket(LEAP_DAY_10H + 3_600, "bob", "gpt-5-mini", "acct-2", 3),
            bucket(LEAP_DAY_10H + 86_400, "alice", "gpt-5-mini", "", 5),
            bucket(LEAP_DAY_10H + 86_400, "alice", "gpt-5", "acct-1", 7),
        ]
    }

    fn names() -> BTreeMap<String, String> {
        BTreeMap::from([("acct-1".to_owned(), "work@example.com".to_owned())])
    }

    fn groups(r: &Report) -> Vec<Vec<String>> {
        r.rows.iter().map(|row| row.group.clone()).collect()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn parse_accepts_every_name_and_rejects_others() {
        for g in Group::ALL {
            assert_eq!(Group::parse(g.name()), Ok(g));
        }
        assert_eq!(Group::parse(" Day "), Ok(Group::Day));
        let err = Group::parse("week").unwrap_err();
        assert!(err.contains("week"), "{err}");
        assert!(err.contains("key, model, account, day, hour"), "{err}");
    }

    #[test]
    fn groups_by_key() {
        let r = report(&sample(), &[Group::Key], &BTreeMap::new(), &names());
        assert_eq!(groups(&r), vec![strings(&["alice"]), strings(&["bob"])]);
        assert_eq!(r.rows[0].totals.requests, 14);
        assert_eq!(r.rows[1].totals.requests, 3);
    }

    #[test]
    fn groups_by_model() {
        let r = report(&sample(), &[Group::Model], &BTreeMap::new(), &names());
        assert_eq!(
            groups(&r),
            vec![strings(&["gpt-5"]), strings(&["gpt-5-mini"])]
        );
        assert_eq!(r.rows[0].totals.requests, 9);
        assert_eq!(r.rows[1].totals.input_tokens, 8_000);
    }

    #[test]
    fn groups_by_account_with_names_and_none() {
        let r = report(&sample(), &[Group::Account], &BTreeMap::new(), &names());
        // Sorted by what is shown: "(none)" < "acct-2" < "work@example.com".
        assert_eq!(
            groups(&r),
            vec![
                strings(&["(none)"]),
                strings(&["acct-2"]),
                strings(&["work@example.com"])
            ]
        );
        assert_eq!(r.rows[0].totals.requests, 5);
        assert_eq!(r.rows[2].totals.requests, 9);
    }

    #[test]
    fn accounts_sharing_a_name_stay_apart() {
        let buckets = [bucket(0, "k", "m", "a", 1), bucket(0, "k", "m", "b", 1)];
        let same = BTreeMap::from([
            ("a".to_owned(), "same".to_owned()),
            ("b".to_owned(), "same".to_owned()),
        ]);
        let r = report(&buckets, &[Group::Account], &BTreeMap::new(), &same);
        assert_eq!(groups(&r), vec![strings(&["same"]), strings(&["same"])]);
    }

    #[test]
    fn groups_by_day() {
        let r = report(&sample(), &[Group::Day], &BTreeMap::new(), &names());
        assert_eq!(
            groups(&r),
            vec![strings(&["2024-02-29"]), strings(&["2024-03-01"])]
        );
        assert_eq!(r.rows[0].totals.requests, 5);
        assert_eq!(r.rows[1].totals.requests, 12);
    }

    #[test]
    fn groups_by_hour() {
        let mut buckets = sample();
        // A bucket whose `hour` is not on the hour still lands in its hour.
        buckets.push(bucket(LEAP_DAY_10H + 1_800, "carol", "gpt-5", "", 1));
        let r = report(&buckets, &[Group::Hour], &BTreeMap::new(), &names());
        assert_eq!(
            groups(&r),
            vec![
                strings(&["2024-02-29T10:00Z"]),
                strings(&["2024-02-29T11:00Z"]),
                strings(&["2024-03-01T10:00Z"]),
            ]
        );
        assert_eq!(r.rows[0].totals.requests, 3);
        assert_eq!(r.rows[2].totals.requests, 12);
    }

    #[test]
    fn groups_by_key_and_day() {
        let r = report(
            &sample(),
            &[Group::Key, Group::Day],
            &BTreeMap::new(),
            &names(),
        );
        assert_eq!(
            groups(&r),
            vec![
                strings(&["alice", "2024-02-29"]),
                strings(&["alice", "2024-03-01"]),
                strings(&["bob", "2024-02-29"]),
            ]
        );
        assert_eq!(r.rows[1].totals.requests, 12);
        assert_eq!(r.rows[1].totals.output_tokens, 1_200);
    }

    #[test]
    fn no_dimensions_make_one_row() {
        let r = report(&sample(), &[], &BTreeMap::new(), &names());
        assert_eq!(groups(&r), vec![Vec::<String>::new()]);
        assert_eq!(r.rows[0].totals, r.total);
        let table = render_table(&r);
        assert_eq!(table.lines().count(), 2, "{table}");
        assert!(
            table.lines().nth(1).unwrap().starts_with("TOTAL"),
            "{table}"
        );
    }

    #[test]
    fn totals_are_the_sum_of_the_buckets() {
        let buckets = sample();
        for by in [vec![], vec![Group::Key], vec![Group::Account, Group::Hour]] {
            let r = report(&buckets, &by, &BTreeMap::new(), &names());
            let t = &r.total;
            assert_eq!(t.requests, buckets.iter().map(|b| b.requests).sum::<u64>());
            assert_eq!(t.errors, buckets.iter().map(|b| b.errors).sum::<u64>());
            assert_eq!(
                t.input_tokens,
                buckets.iter().map(|b| b.input_tokens).sum::<u64>()
            );
            assert_eq!(
                t.cached_tokens,
                buckets.iter().map(|b| b.cached_tokens).sum::<u64>()
            );
            assert_eq!(
                t.output_tokens,
                buckets.iter().map(|b| b.output_tokens).sum::<u64>()
            );
            assert_eq!(
                t.reasoning_tokens,
                buckets.iter().map(|b| b.reasoning_tokens).sum::<u64>()
            );
            assert_eq!(
                t.duration_ms,
                buckets.iter().map(|b| b.duration_ms).sum::<u64>()
            );
            assert_eq!(t.cost_usd, None);
            assert_eq!(
                r.rows.iter().map(|row| row.totals.requests).sum::<u64>(),
                t.requests
            );
            assert_eq!(t.cache_hit_ratio(), Some(0.4));
        }
    }

    #[test]
    fn dates_across_boundaries_and_leap_days() {
        assert_eq!(format_day(0), "1970-01-01");
        assert_eq!(format_hour(0), "1970-01-01T00:00Z");
        // 2023-12-31T23:00Z and the hour after it.
        assert_eq!(format_hour(1_704_063_600), "2023-12-31T23:00Z");
        assert_eq!(format_hour(1_704_067_200), "2024-01-01T00:00Z");
        // 2024-01-31T23:59:59Z, then February.
        assert_eq!(format_day(1_706_745_599), "2024-01-31");
        assert_eq!(format_day(1_706_745_600), "2024-02-01");
        // Leap day 2024 and the day after.
        assert_eq!(format_hour(LEAP_DAY_10H), "2024-02-29T10:00Z");
        assert_eq!(format_day(LEAP_DAY_10H + 14 * 3_600), "2024-03-01");
        // 2000 is a leap year (divisible by 400); 2100 is not.
        assert_eq!(format_day(951_782_400), "2000-02-29");
        assert_eq!(format_day(4_107_542_400), "2100-03-01");
        assert_eq!(format_day(4_107_542_399), "2100-02-28");
    }

    #[test]
    fn day_and_hour_rows_sort_chronologically() {
        let buckets = [
            bucket(1_704_067_200, "k", "m", "", 1), // 2024-01-01T00
            bucket(1_704_063_600, "k", "m", "", 1), // 2023-12-31T23
            bucket(1_704_070_800, "k", "m", "", 1), // 2024-01-01T01
        ];
        let r = report(&buckets, &[Group::Hour], &BTreeMap::new(), &names());
        assert_eq!(
            groups(&r),
            vec![
                strings(&["2023-12-31T23:00Z"]),
                strings(&["2024-01-01T00:00Z"]),
                strings(&["2024-01-01T01:00Z"]),
            ]
        );
        let r = report(&buckets, &[Group::Day], &BTreeMap::new(), &names());
        assert_eq!(
            groups(&r),
            vec![strings(&["2023-12-31"]), strings(&["2024-01-01"])]
        );
        assert_eq!(r.rows[1].totals.requests, 2);
    }

    #[test]
    fn cost_only_from_priced_models() {
        let prices = BTreeMap::from([(
            "gpt-5".to_owned(),
            Price {
                input: 1.25,
                cached_input: 0.125,
                output: 10.0,
            },
        )]);
        let r = report(&sample(), &[Group::Model], &prices, &names());
        assert!(r.priced);
        assert_eq!(r.unpriced_models, strings(&["gpt-5-mini"]));
        // gpt-5: 9 requests' worth: 5_400 uncached, 3_600 cached, 900 output tokens.
        let expected = (5_400.0 * 1.25 + 3_600.0 * 0.125 + 900.0 * 10.0) / 1e6;
        let gpt5 = r.rows[0].totals.cost_usd.unwrap();
        assert!((gpt5 - expected).abs() < 1e-12, "{gpt5}");
        assert_eq!(r.rows[1].totals.cost_usd, Some(0.0));
        assert!((r.total.cost_usd.unwrap() - expected).abs() < 1e-12);

        let table = render_table(&r);
        assert!(
            table.lines().next().unwrap().ends_with("COST USD"),
            "{table}"
        );
        assert!(table.contains("$0.0162"), "{table}");
        assert!(
            table.ends_with("no price for: gpt-5-mini (not in the cost)\n"),
            "{table}"
        );
        let csv = render_csv(&r);
        assert!(
            csv.lines()
                .next()
                .unwrap()
                .ends_with(",cache_hit_ratio,cost_usd")
        );
        assert!(csv.contains("gpt-5,9,"), "{csv}");
    }

    #[test]
    fn no_prices_means_no_cost() {
        let r = report(&sample(), &[Group::Key], &BTreeMap::new(), &names());
        assert!(!r.priced);
        assert!(r.rows.iter().all(|row| row.totals.cost_usd.is_none()));
        let table = render_table(&r);
        assert!(!table.contains("COST"), "{table}");
        assert!(!table.contains("no price"), "{table}");
        assert!(!render_csv(&r).contains("cost_usd"));
    }

    #[test]
    fn table_is_aligned_with_a_total() {
        let r = report(
            &sample(),
            &[Group::Key, Group::Day],
            &BTreeMap::new(),
            &names(),
        );
        let table = render_table(&r);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5, "{table}");
        assert_eq!(
            lines[0],
            "KEY    DAY         REQUESTS  ERRORS  INPUT  CACHED  OUTPUT  REASONING  CACHE HIT"
        );
        assert_eq!(
            lines[1],
            "alice  2024-02-29         2       1   2000     800     200         60        40%"
        );
        assert_eq!(
            lines[4],
            "TOTAL                    17       7  17000    6800    1700        510        40%"
        );
        let ends: Vec<usize> = lines.iter().map(|l| l.chars().count()).collect();
        assert!(ends.iter().all(|e| *e == ends[0]), "{table}");
    }

    #[test]
    fn table_shows_a_dash_without_input() {
        let mut b = bucket(0, "k", "m", "", 1);
        b.input_tokens = 0;
        b.cached_tokens = 0;
        let r = report(&[b], &[Group::Key], &BTreeMap::new(), &names());
        assert_eq!(r.total.cache_hit_ratio(), None);
        let table = render_table(&r);
        assert!(table.lines().nth(1).unwrap().ends_with('–'), "{table}");
        assert!(render_csv(&r).ends_with(",\n"));
    }

    #[test]
    fn csv_quotes_commas_and_quotes() {
        let buckets = [bucket(0, "ops, \"night\" shift", "gpt-5", "", 1)];
        let r = report(
            &buckets,
            &[Group::Key, Group::Model],
            &BTreeMap::new(),
            &names(),
        );
        let csv = render_csv(&r);
        assert_eq!(
            csv,
            "key,model,requests,errors,input_tokens,cached_tokens,output_tokens,\
             reasoning_tokens,cache_hit_ratio\n\
             \"ops, \"\"night\"\" shift\",gpt-5,1,0,1000,400,100,30,0.4000\n"
        );
        assert_eq!(csv_field("a\nb"), "\"a\nb\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn json_parses_back_with_every_field() {
        let prices = BTreeMap::from([(
            "gpt-5".to_owned(),
            Price {
                input: 1.0,
                cached_input: 0.5,
                output: 2.0,
            },
        )]);
        let r = report(
            &sample(),
            &[Group::Account, Group::Model],
            &prices,
            &names(),
        );
        let v: serde_json::Value = serde_json::from_str(&render_json(&r)).unwrap();
        assert_eq!(v["by"], serde_json::json!(["account", "model"]));
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), r.rows.len());
        assert_eq!(rows[0]["account"], "(none)");
        assert_eq!(rows[0]["model"], "gpt-5-mini");
        assert_eq!(rows[0]["cost_usd"], 0.0);
        let last = rows.last().unwrap();
        assert_eq!(last["account"], "work@example.com");
        assert_eq!(last["requests"], 9);
        for field in [
            "errors",
            "input_tokens",
            "cached_tokens",
            "output_tokens",
            "reasoning_tokens",
            "duration_ms",
            "cache_hit_ratio",
        ] {
            assert!(last[field].is_number(), "{field}: {last}");
        }
        assert_eq!(last["cache_hit_ratio"], 0.4);
        assert!(last["cost_usd"].as_f64().unwrap() > 0.0);
        assert_eq!(v["total"]["requests"], 17);
        assert_eq!(v["total"]["duration_ms"], 4_250);
        assert!(v["total"].get("account").is_none());
        assert_eq!(v["unpriced_models"], serde_json::json!(["gpt-5-mini"]));

        let unpriced = report(&[], &[Group::Key], &BTreeMap::new(), &names());
        let v: serde_json::Value = serde_json::from_str(&render_json(&unpriced)).unwrap();
        assert_eq!(v["total"]["cost_usd"], serde_json::Value::Null);
        assert_eq!(v["total"]["cache_hit_ratio"], serde_json::Value::Null);
    }

    #[test]
    fn empty_input() {
        let prices = BTreeMap::from([(
            "gpt-5".to_owned(),
            Price {
                input: 1.0,
                cached_input: 0.5,
                output: 2.0,
            },
        )]);
        for by in [vec![], vec![Group::Key, Group::Day]] {
            let r = report(&[], &by, &prices, &names());
            assert!(r.rows.is_empty());
            assert_eq!(
                r.total,
                Totals {
                    cost_usd: Some(0.0),
                    ..Totals::default()
                }
            );
            assert!(r.unpriced_models.is_empty());
            assert_eq!(render_table(&r), "no usage in this period\n");
        }
        let r = report(&[], &[Group::Key, Group::Day], &prices, &names());
        assert_eq!(
            render_csv(&r),
            "key,day,requests,errors,input_tokens,cached_tokens,output_tokens,\
             reasoning_tokens,cache_hit_ratio,cost_usd\n"
        );
        let v: serde_json::Value = serde_json::from_str(&render_json(&r)).unwrap();
        assert_eq!(v["rows"], serde_json::json!([]));
        assert_eq!(v["total"]["requests"], 0);
    }
}
